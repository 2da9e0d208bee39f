-- probe: which commands that dlock's scripts call may the user running it not run? Dial and New
-- run it once, so that a missing ACL rule fails there with its name, not later inside a lock.
-- KEYS[1]  a key of a name nobody locks: <prefix>{dlock-probe:<random>}
-- KEYS[2]  its queue <key>:q, KEYS[3] its entries <key>:w
-- ARGV[1]  its release channel
-- ARGV[2]  "s" for SPUBLISH (Redis Cluster), else PUBLISH
-- Reply    the names of the commands the user may not run (empty when it may run them all).
-- Nothing is left behind: the key is set only if absent, for 1 ms; the queue member and the
-- entry field are removed; the announcement ("0") is older than any holder a waiter waits for.
local denied = {}
local function try(name, ...)
  local r = redis.pcall(name, ...)
  if type(r) == 'table' and r.err then
    local e = r.err
    if string.find(e, 'NOPERM', 1, true) or string.find(e, 'permission', 1, true) or string.find(e, "can't run", 1, true) then
      denied[#denied + 1] = string.lower(name)
    end
  end
end
local publish, numsub = 'PUBLISH', 'NUMSUB'
if ARGV[2] == 's' then
  publish, numsub = 'S' .. publish, 'SHARD' .. numsub -- built at run time, as in release.lua
end
try('GET', KEYS[1])
try('SET', KEYS[1], '- 0 0', 'NX', 'PX', 1)
try('PEXPIRE', KEYS[1], 1)
try('PTTL', KEYS[1])
try('TIME')
try('EXISTS', KEYS[2])
try('ZADD', KEYS[2], 0, 'dlock-probe')
try('ZRANGE', KEYS[2], 0, 0)
try('ZSCORE', KEYS[2], 'dlock-probe')
try('ZCARD', KEYS[2])
try('ZREM', KEYS[2], 'dlock-probe')
try('HSET', KEYS[3], 'dlock-probe', 'x')
try('HGET', KEYS[3], 'dlock-probe')
try('HMGET', KEYS[3], 'dlock-probe') -- HMGET and HGETALL: read-write locks and semaphores (shared.lua)
try('HGETALL', KEYS[3])
try('HINCRBY', KEYS[3], 'dlock-probe', 0)
try('HDEL', KEYS[3], 'dlock-probe')
try(publish, ARGV[1], '0')
local function trySub(sub, ...)
  local r = redis.pcall('PUBSUB', sub, ...)
  if type(r) == 'table' and r.err and (string.find(r.err, 'NOPERM', 1, true) or string.find(r.err, 'permission', 1, true) or string.find(r.err, "can't run", 1, true)) then
    denied[#denied + 1] = 'pubsub|' .. string.lower(sub)
  end
end
trySub(numsub, ARGV[1])
if ARGV[2] ~= 's' then
  trySub('NUMPAT')
end
return denied
