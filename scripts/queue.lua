-- queue: keep a client's queue entries alive (the renewal loop sends it for every lock its
-- client waits for, a third of the acceptance window after the last refresh).
-- KEYS       pairs: <lock key>:q, <lock key>:w (see acquire.lua), one pair per entry
-- ARGV[2i-1] the entry's id (the registration's) for pair i
-- ARGV[2i]   its acceptance window in ms
-- Reply      array: 1 per entry refreshed (it expires one window from now), 0 per entry the
--            server no longer has (granted, or expired: its client queues again at its next
--            attempt).
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
local r = {}
for i = 1, #KEYS / 2 do
  local q, w, id = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1]
  local e = redis.call('HGET', w, id)
  if e then
    local win = tonumber(ARGV[2 * i])
    redis.call('HSET', w, id, string.format('%d', ms + win) .. string.sub(e, (string.find(e, ' ', 1, true))))
    local keep = math.max(win, redis.call('PTTL', q))
    redis.call('PEXPIRE', q, keep)
    redis.call('PEXPIRE', w, keep)
    r[i] = 1
  else
    r[i] = 0
  end
end
return r
