-- fenced: one operation on an application's own key, allowed only to a fencing token at least
-- as new as the key's fence (docs/PROTOCOL.md, "Fenced operations on your own keys").
--
-- KEYS  V  the application's key (a string, or a hash for the field operations)
--       F  its fence: a string holding the newest token that used V, in decimal; in V's slot
--          (the client names it: V..":dlock-fence" when V has a hash tag, else
--          "{"..V.."}:dlock-fence")
-- ARGV  op, token, keep ms, then the operation's arguments:
--   g  get       -> {1, value} or {1} when V does not exist
--   s  set       value, ttl ms (0: no expiry)            -> {1}
--   i  incrby    n                                       -> {1, V's new value}
--   d  del                                               -> {1, keys deleted (0 or 1)}
--   G  hget      field   -> {1, value} or {1} when the field or V does not exist
--   S  hset      field, value                            -> {1, fields created (0 or 1)}
--   I  hincrby   field, n                                -> {1, the field's new value}
-- A token older than the fence is refused, and nothing changes: -> {0, the fence's token}.
-- Otherwise the operation runs first (a Redis error, WRONGTYPE say, then leaves both keys as they
-- were: nothing was written before it), then F is set to the token, with an expiry that follows
-- V's: none while V has none, else V's remaining time plus keep (the client's token retention),
-- and keep alone once V is gone. So the fence outlives its value by keep: a holder paused past a
-- newer holder's delete (or past the value's expiry) is still refused for that long. (With the
-- fence's own token, an operation that neither creates V nor changes its expiry leaves F alone.)
-- Tokens are below 2^53, so Lua's numbers (doubles) hold and compare them exactly; the values
-- that incrby and hincrby return are exact up to 2^53 too (the stored value always is).
local op = ARGV[1]
local token = tonumber(ARGV[2])
local V, F = KEYS[1], KEYS[2]

local fence = redis.call('GET', F)
local same = false -- the token is the fence's: the same holder again
if fence then
  local f = tonumber(fence)
  if not f then
    return redis.error_reply('ERR dlock: the fence key ' .. F .. ' holds no token')
  end
  if f > token then
    return {0, f}
  end
  same = f == token
end

-- seal moves the fence to the token; pttl is V's remaining time after the operation (-1: no
-- expiry, -2: V is gone).
local function seal(pttl)
  if pttl == -1 then
    redis.call('SET', F, ARGV[2])
  elseif pttl == -2 then
    redis.call('SET', F, ARGV[2], 'PX', ARGV[3])
  else
    redis.call('SET', F, ARGV[2], 'PX', pttl + tonumber(ARGV[3]))
  end
end

-- An operation that neither creates V nor changes its expiry leaves the fence of the same token
-- alone: its expiry still follows V's, as the operation that last moved it set it. INCRBY's and
-- HINCRBY's result equals n only when they may have created the key (or the field), and HSET's
-- is 0 only when the field, so the hash, was there.
if op == 'i' then
  local n = redis.call('INCRBY', V, ARGV[4])
  if not (same and n ~= tonumber(ARGV[4])) then
    seal(redis.call('PTTL', V))
  end
  return {1, n}
elseif op == 'g' then
  local v = redis.call('GET', V)
  if not same then
    seal(redis.call('PTTL', V))
  end
  if v then
    return {1, v}
  end
  return {1}
elseif op == 's' then
  local ttl = tonumber(ARGV[5])
  if ttl > 0 then
    redis.call('SET', V, ARGV[4], 'PX', ARGV[5])
    seal(ttl)
  else
    redis.call('SET', V, ARGV[4])
    seal(-1)
  end
  return {1}
elseif op == 'd' then
  local n = redis.call('DEL', V)
  seal(-2)
  return {1, n}
elseif op == 'G' then
  local v = redis.call('HGET', V, ARGV[4])
  if not same then
    seal(redis.call('PTTL', V))
  end
  if v then
    return {1, v}
  end
  return {1}
elseif op == 'S' then
  local n = redis.call('HSET', V, ARGV[4], ARGV[5])
  if not (same and n == 0) then
    seal(redis.call('PTTL', V))
  end
  return {1, n}
elseif op == 'I' then
  local n = redis.call('HINCRBY', V, ARGV[4], ARGV[5])
  if not (same and n ~= tonumber(ARGV[5])) then
    seal(redis.call('PTTL', V))
  end
  return {1, n}
end
return redis.error_reply('ERR dlock: fenced.lua: unknown operation ' .. tostring(op))
