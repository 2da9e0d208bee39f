-- handover: pass a lock from its holder straight to a waiter of the same client, in one atomic
-- step (the holder's release and the waiter's acquisition in one round trip).
-- KEYS[1]  lock key
-- ARGV[1]  holder's owner secret
-- ARGV[2]  the waiter's new owner secret (no spaces)
-- ARGV[3]  the waiter's lease in milliseconds
-- ARGV[4]  holder description for the waiter
-- ARGV[5]  handovers in a row so far within this client
-- ARGV[6]  from this many handovers in a row on, check that no other client waits
-- ARGV[7]  release channel
-- ARGV[8]  this client's own subscriptions to the channel (0 or 1)
-- ARGV[9]  "s" to count sharded subscribers (Redis Cluster), else plain ones
-- ARGV[10] the holder's token, larger than the stored one when the lock passed among the
--          client's waiters without the server (at most 15 past it)
-- Reply    {1, token}  handed over: the waiter holds the lock with a new token
--          {0, 0}      refused: other clients wait and the limit is reached; release instead
--          {-1, 0}     the holder does not own the lock
-- Fairness: other clients' waiters are subscribed to the release channel. While there are
-- none, a client may pass the lock among its own waiters indefinitely; while there are, the
-- check refuses and the holder releases, which lets every client compete.
local v = redis.call('GET', KEYS[1])
if not v then
  return {-1, 0}
end
local o, t = string.match(v, '^(%S+) (%d+) ')
if o ~= ARGV[1] then
  return {-1, 0}
end
if tonumber(ARGV[5]) >= tonumber(ARGV[6]) then
  local count = 'NUMSUB'
  if ARGV[9] == 's' then
    count = 'SHARD' .. count
  end
  local pubsub = 'PUB' .. 'SUB' -- built at run time, as in release.lua
  local r = redis.pcall(pubsub, count, ARGV[7])
  -- A server that cannot count subscribers from a script (some embedded test servers) gets a
  -- real release instead.
  if type(r) ~= 'table' or r.err or tonumber(r[2]) == nil or tonumber(r[2]) > tonumber(ARGV[8]) then
    return {0, 0}
  end
end
local now = redis.call('TIME')
local token = now[1] * 1000000 + now[2]
local last = math.max(tonumber(t), tonumber(ARGV[10]) or 0)
if last >= token then
  token = last + 1
end
redis.call('SET', KEYS[1], ARGV[2] .. ' ' .. string.format('%d', token) .. ' 1 ' .. ARGV[4], 'PX', ARGV[3])
return {1, token}
