-- pttl: the remaining lease as the server sees it, for the owner only.
-- KEYS[1]  lock key
-- ARGV[1]  owner secret
-- Reply    remaining milliseconds, or -2 when the caller does not own the lock.
if redis.call('HGET', KEYS[1], 'o') == ARGV[1] then
  return redis.call('PTTL', KEYS[1])
end
return -2
