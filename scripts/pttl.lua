-- pttl: the remaining lease as the server sees it, for the owner only.
-- KEYS[1]  lock key
-- ARGV[1]  owner secret
-- Reply    remaining milliseconds, or -2 when the caller does not own the lock.
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  return redis.call('PTTL', KEYS[1])
end
return -2
