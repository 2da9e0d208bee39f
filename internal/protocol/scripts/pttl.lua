-- pttl: the remaining lease as the server sees it, for the owner only.
-- KEYS[1]  lock key
-- ARGV[1]  owner secret
-- Reply    remaining milliseconds, or -2 when the caller does not own the lock.
local v = redis.call('GET', KEYS[1])
if v and string.byte(v, #ARGV[1] + 1) == 32 and string.find(v, ARGV[1], 1, true) == 1 then
  return redis.call('PTTL', KEYS[1])
end
return -2
