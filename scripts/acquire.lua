-- acquire: take the lock, or re-enter it as the same owner, in one atomic step.
-- KEYS[1]  lock key: <prefix>{<name>}
-- ARGV[1]  owner secret of the caller
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  holder description (host, pid, process start, label)
-- ARGV[4]  "r" to re-enter only: never take a free lock (a lease that lost its lock must not
--          silently get a new one with a different token)
-- Reply    {1, token, holds}     taken (holds = 1) or re-entered by the same owner (holds > 1)
--          {0, pttl, token}      held by another owner: its remaining lease (ms) and its token
--          {0, -2, 0}            re-entry asked for, but the lock is free
-- The token is max(last token + 1, server time in microseconds). The last token outlives a release
-- (see release.lua) so tokens keep increasing within that window; after the key is gone the server
-- clock alone keeps them increasing.
local v = redis.call('HMGET', KEYS[1], 'o', 't', 'n')
if not v[1] then
  if ARGV[4] == 'r' then
    return {0, -2, 0}
  end
  local now = redis.call('TIME')
  local t = now[1] * 1000000 + now[2]
  local last = tonumber(v[2])
  if last and last >= t then
    t = last + 1
  end
  redis.call('HSET', KEYS[1], 'o', ARGV[1], 't', string.format('%d', t), 'n', 1, 'm', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, t, 1}
end
if v[1] == ARGV[1] then
  local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(v[2]), n}
end
return {0, redis.call('PTTL', KEYS[1]), tonumber(v[2])}
