-- inspect: read locks for inspection tools (dlock status, dlock list) without changing them.
-- KEYS      lock keys
-- Reply     two elements per key: its value (nil when there is no key, or the key is not a
--           string) and its PTTL in milliseconds (-2 when there is no key, -1 without expiry).
-- Value and PTTL of a key are read together, in one atomic step.
local r = {}
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  if type(v) ~= 'string' then
    v = false
  end
  r[2 * i - 1] = v
  r[2 * i] = redis.call('PTTL', KEYS[i])
end
return r
