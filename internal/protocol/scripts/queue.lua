-- uses: clock, keepQueue
-- queue: keep a client's queue entries alive (the renewal loop sends it for every lock its
-- client waits for, a third of the acceptance window after the last refresh), and tell the
-- client when each lock may next be free.
-- KEYS       triples: <lock key>:q, <lock key>:w (see acquire.lua), <lock key>; one per entry
-- ARGV[3i-2] the entry's id (the registration's) for triple i
-- ARGV[3i-1] its acceptance window in ms
-- ARGV[3i]   "l" to report the lock at the triple's third key (a Mutex's entry); "" to leave
--            that key alone (the entry of a read-write lock or semaphore, whose third key is
--            its hash)
-- ARGV[3n+i] optional (n entries): how many goroutines of the client wait behind entry i; kept
--            in the entry's description as "waiting":N, for inspection (inspect.lua)
-- Reply      array of 2n: first, per entry, 1 when refreshed (it expires one window from now),
--            0 when the server no longer has it (granted, or expired: its client queues again
--            at its next attempt); then, per entry, for an entry refreshed with "l", the ms
--            until the lock's holder's lease (or a grant to another entry) runs out: 0 when the
--            lock is free (no key, or the released value "- <token> 0"), its PTTL when held
--            (-1: no expiry); -1 for the others. A waiting client attempts when that time has
--            passed: a grant to a client that died waiting lapses with its entry, and without
--            this nobody would look again until the last holder's lease it saw ran out.
clock()
local n = #KEYS / 3
local r = {}
for i = 1, n do
  local q, w, id = KEYS[3 * i - 2], KEYS[3 * i - 1], ARGV[3 * i - 2]
  local e = redis.call('HGET', w, id)
  r[n + i] = -1
  if e then
    local win = tonumber(ARGV[3 * i - 1])
    local rest = string.sub(e, (string.find(e, ' ', 1, true))) -- " <window> <owner> <description>"
    local c = tonumber(ARGV[3 * n + i] or '')
    if c then
      -- The description is the client's JSON object: replace its count, or add one.
      rest = string.gsub(rest, ',"waiting":%d+}$', '}', 1)
      if string.sub(rest, -1) == '}' then
        rest = string.sub(rest, 1, -2) .. ',"waiting":' .. string.format('%d', c) .. '}'
      end
    end
    redis.call('HSET', w, id, string.format('%d', nowms + win) .. rest)
    keepQueue(q, w, win)
    r[i] = 1
    if ARGV[3 * i] == 'l' then
      local key = KEYS[3 * i]
      local v = redis.call('GET', key)
      if not v or (string.byte(v, 1) == 45 and string.byte(v, 2) == 32) then
        r[n + i] = 0
      else
        r[n + i] = redis.call('PTTL', key)
      end
    end
  else
    r[i] = 0
  end
end
return r
