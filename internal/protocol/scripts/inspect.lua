-- inspect: read locks for inspection tools (dlock status, dlock list) without changing them.
-- KEYS      triples: a lock key, its queue <lock key>:q and its entries <lock key>:w (see
--           acquire.lua)
-- Reply     four elements per lock: its value (nil when there is no key, or the key is not a
--           string), its PTTL in milliseconds (-2 when there is no key, -1 without expiry), the
--           number of clients in its queue (live or not yet found expired), and the goroutines
--           waiting in those clients: the sum of the "waiting" counts their entries carry
--           (queue.lua keeps them; an entry without one counts 1).
-- Value and PTTL of a key are read together, in one atomic step.
local r = {}
for i = 1, #KEYS / 3 do
  local k = KEYS[3 * i - 2]
  local v = redis.pcall('GET', k)
  if type(v) ~= 'string' then
    v = false
  end
  local q, g = 0, 0
  local ids = redis.pcall('ZRANGE', KEYS[3 * i - 1], 0, -1)
  if type(ids) == 'table' and not ids.err then
    q = #ids
    for _, id in ipairs(ids) do
      local e = redis.pcall('HGET', KEYS[3 * i], id)
      if type(e) == 'string' then
        g = g + (tonumber(string.match(e, ',"waiting":(%d+)}$')) or 1)
      end
    end
  end
  r[4 * i - 3] = v
  r[4 * i - 2] = redis.call('PTTL', k)
  r[4 * i - 1] = q
  r[4 * i] = g
end
return r
