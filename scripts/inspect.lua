-- inspect: read locks for inspection tools (dlock status, dlock list) without changing them.
-- KEYS      pairs: a lock key, then its queue <lock key>:q (see acquire.lua)
-- Reply     three elements per lock: its value (nil when there is no key, or the key is not a
--           string), its PTTL in milliseconds (-2 when there is no key, -1 without expiry), and
--           the number of clients in its queue (live or not yet found expired).
-- Value and PTTL of a key are read together, in one atomic step.
local r = {}
for i = 1, #KEYS / 2 do
  local k = KEYS[2 * i - 1]
  local v = redis.pcall('GET', k)
  if type(v) ~= 'string' then
    v = false
  end
  local q = redis.pcall('ZCARD', KEYS[2 * i])
  if type(q) ~= 'number' then
    q = 0
  end
  r[3 * i - 2] = v
  r[3 * i - 1] = redis.call('PTTL', k)
  r[3 * i] = q
end
return r
