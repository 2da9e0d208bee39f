-- renew: extend many leases in one call (the renewal loop batches every due lease of a client).
-- KEYS[i]      lock keys
-- ARGV[2i-1]   owner secret for KEYS[i]
-- ARGV[2i]     new lease in milliseconds for KEYS[i]
-- Reply        array: 1 where the lease was extended, 0 where the owner no longer holds the lock,
--              -1 where the lock is released ("- <token> 0"): someone else released it while the
--              owner held it (an administrator's force unlock).
local r = {}
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  local o = ARGV[2 * i - 1]
  -- The value starts with "<owner> ": compared without building substrings (cheaper per key).
  if v and string.byte(v, #o + 1) == 32 and string.find(v, o, 1, true) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    r[i] = 1
  elseif v and string.byte(v, 1) == 45 and string.byte(v, 2) == 32 then
    r[i] = -1
  else
    r[i] = 0
  end
end
return r
