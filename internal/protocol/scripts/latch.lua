-- uses: publish, clock
-- latch: a countdown latch. Read it (creating it on first use), count it down, or only read it.
-- KEYS[1]  latch key: <prefix>{<name>}:latch, a hash: n = count left, c = initial count,
--          d = deadline (server time, ms), and "i:<id>" for each id that counted down
-- ARGV[1]  "c": read, creating the latch when absent; "d": count down (creating it first when
--          absent); "s": read only, never create
-- ARGV[2]  the initial count ("0": never create; use the stored count, whatever it is)
-- ARGV[3]  the latch's life in ms, from its creation (its TTL)
-- ARGV[4]  how long an expired latch's record stays after its deadline, in ms
-- ARGV[5]  channel on which the count reaching zero is announced: <latch key>:rel
-- ARGV[6]  "s" to announce with SPUBLISH (Redis Cluster), else PUBLISH
-- ARGV[7]  with "d": the id of this count-down ("" for none); a second count-down with the same
--          id counts nothing
-- Reply    {status, left, initial, ms to the deadline (0 or less: expired)}
--          status 0 read, or nothing to count (expired, or already zero)
--                 1 counted down by this call
--                 2 this id had counted down already
--                 3 a latch with another initial count exists (nothing changed)
--                 4 no latch (ARGV[2] is "0", or "s")
-- The key expires the retention after the deadline: until then an expired latch reads as
-- expired (a waiter that comes late is told), then the name is free for a new latch. A count
-- that reached zero stays zero (the latch is open) until the deadline; counting down past zero
-- changes nothing. An id is recorded only when it counts, so at most the initial count of them
-- are kept; they go with the key.
local k = KEYS[1]
clock()
local left = tonumber(redis.call('HGET', k, 'n'))
local initial, deadline
if left then
  initial = tonumber(redis.call('HGET', k, 'c'))
  deadline = tonumber(redis.call('HGET', k, 'd'))
else
  if ARGV[1] == 's' or ARGV[2] == '0' then
    return {4, 0, 0, 0}
  end
  initial = tonumber(ARGV[2])
  left = initial
  deadline = nowms + tonumber(ARGV[3])
  redis.call('HSET', k, 'n', left, 'c', initial, 'd', string.format('%d', deadline))
  redis.call('PEXPIRE', k, tonumber(ARGV[3]) + tonumber(ARGV[4]))
end
local rest = deadline - nowms
if ARGV[2] ~= '0' and tonumber(ARGV[2]) ~= initial then
  return {3, left, initial, rest}
end
if ARGV[1] ~= 'd' or rest <= 0 or left <= 0 then
  return {0, left, initial, rest}
end
local id = ARGV[7]
if id ~= '' then
  if redis.call('HGET', k, 'i:' .. id) then
    return {2, left, initial, rest}
  end
end
left = left - 1
if left > 0 then
  if id ~= '' then
    redis.call('HSET', k, 'n', left, 'i:' .. id, '1')
  else
    redis.call('HSET', k, 'n', left)
  end
  return {1, left, initial, rest}
end
-- Zero: the latch opens.
redis.call('HSET', k, 'n', 0)
publish(ARGV[6], ARGV[5], '0')
return {1, 0, initial, rest}
