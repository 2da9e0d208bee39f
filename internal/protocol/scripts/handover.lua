-- uses: clock
-- handover: pass a lock from its holder straight to a waiter of the same client, in one atomic
-- step (the holder's release and the waiter's acquisition in one round trip).
-- KEYS[1]  lock key
-- KEYS[2]  queue: <lock key>:q (see acquire.lua)
-- ARGV[1]  holder's owner secret
-- ARGV[2]  the waiter's new owner secret (no spaces)
-- ARGV[3]  the waiter's lease in milliseconds
-- ARGV[4]  holder description for the waiter
-- ARGV[5]  handovers in a row so far within this client
-- ARGV[6]  from this many handovers in a row on, refuse while other clients queue
-- ARGV[7]  this client's id (its own queue entries do not count as another client)
-- ARGV[8]  the holder's token, larger than the stored one when the lock passed among the
--          client's waiters without the server (at most 15 past it)
-- Reply    {1, token}  handed over: the waiter holds the lock with a new token
--          {0, 0}      refused: other clients queue and the limit is reached; release instead
--          {-1, 0}     the holder does not own the lock
-- Fairness: a client may pass the lock among its own waiters indefinitely while no other
-- client queues for it; once one does, the check refuses and the holder releases, which grants
-- the lock to the first client in the queue (release.lua).
local v = redis.call('GET', KEYS[1])
if not v then
  return {-1, 0}
end
local o, t = string.match(v, '^(%S+) (%d+) ')
if o ~= ARGV[1] then
  return {-1, 0}
end
if tonumber(ARGV[5]) >= tonumber(ARGV[6]) and redis.call('ZCARD', KEYS[2]) > 0 then
  -- Entry ids are "<client id>.<sequence>": this client's own entries are not other clients.
  local mine = ARGV[7] .. '.'
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    if string.sub(id, 1, #mine) ~= mine then
      return {0, 0}
    end
  end
end
clock()
local token = now
local last = math.max(tonumber(t), tonumber(ARGV[8]) or 0)
if last >= token then
  token = last + 1
end
redis.call('SET', KEYS[1], ARGV[2] .. ' ' .. string.format('%d', token) .. ' 1 ' .. ARGV[4], 'PX', ARGV[3])
return {1, token}
