-- release: give up one hold, or all of them, if and only if the caller owns the lock.
-- KEYS[1]  lock key
-- ARGV[1]  owner secret
-- ARGV[2]  milliseconds to keep the last token after the final release
-- ARGV[3]  release channel: <prefix>{<name>}:rel
-- ARGV[4]  "1" to drop every hold at once, "0" to drop one
-- Reply    holds left (0 = released and waiters notified), or -1 when the caller does not own the lock.
local v = redis.call('HMGET', KEYS[1], 'o', 'n', 't')
if v[1] ~= ARGV[1] then
  return -1
end
local n = tonumber(v[2]) - 1
if n > 0 and ARGV[4] ~= '1' then
  redis.call('HSET', KEYS[1], 'n', n)
  return n
end
redis.call('HDEL', KEYS[1], 'o', 'n', 'm')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], v[3])
return 0
