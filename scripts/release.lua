-- release: give up one hold, or all of them, if and only if the caller owns the lock.
-- KEYS[1]  lock key
-- ARGV[1]  owner secret
-- ARGV[2]  milliseconds to keep the last token after the final release
-- ARGV[3]  release channel: <prefix>{<name>}:rel
-- ARGV[4]  "1" to drop every hold at once, "0" to drop one
-- ARGV[5]  optional: "s" to announce with SPUBLISH (Redis Cluster, sharded pub/sub), else PUBLISH
-- ARGV[6]  optional: a token floor (quorum mode, or a holder that got the lock by a local
--          handoff): the token kept after the final release is the larger of the lock's
--          token and this one
-- ARGV[7]  optional: "c" to count who heard the release (ARGV[5] and ARGV[6] must then be given;
--          a floor of 0 is none)
-- Reply    holds left (0 = released and waiters notified), or -1 when the caller does not own the
--          lock; with "c", a final release replies {0, subscribers that received the notice}.
-- The release notice carries the released token, so waiters can ignore stale notices.
--
-- A release only ever frees memory, so it must work on a server out of memory too (maxmemory
-- reached under the noeviction policy). There Redis refuses a script's first write that may
-- need memory (SET), but not one that cannot (PEXPIRE), and lets a script that has written
-- finish. So a SET refused for memory is made again after a PEXPIRE of the same key (to
-- pexpire ms, or, when nil, to the key's remaining time).
local function set(pexpire, ...)
  local r = redis.pcall('SET', KEYS[1], ...)
  if type(r) == 'table' and r.err then
    local ms = pexpire or redis.call('PTTL', KEYS[1])
    if string.sub(r.err, 1, 3) == 'OOM' and ms > 0 then
      redis.call('PEXPIRE', KEYS[1], ms)
    end
    redis.call('SET', KEYS[1], ...)
  end
end
local v = redis.call('GET', KEYS[1])
local o = ARGV[1]
if not v or string.byte(v, #o + 1) ~= 32 or string.find(v, o, 1, true) ~= 1 then
  return -1
end
-- "<owner> <token> <holds> <description>", read with string.find/sub (cheaper than a pattern)
local s2 = string.find(v, ' ', #o + 2, true)
if not s2 then
  return -1
end
local t = string.sub(v, #o + 2, s2 - 1)
local s3 = string.find(v, ' ', s2 + 1, true)
local n = tonumber(string.sub(v, s2 + 1, (s3 or 0) - 1)) or 1
if n > 1 and ARGV[4] ~= '1' then
  n = n - 1
  local m = ''
  if s3 then
    m = string.sub(v, s3 + 1)
  end
  set(nil, o .. ' ' .. t .. ' ' .. n .. ' ' .. m, 'KEEPTTL')
  return n
end
local floor = tonumber(ARGV[6])
if floor and floor > tonumber(t) then
  t = string.format('%d', floor)
end
set(tonumber(ARGV[2]), '- ' .. t .. ' 0', 'PX', ARGV[2])
-- The command name is built at run time: some embedded test servers refuse, when compiling a
-- script, every command name they do not know, even one the script would not call.
local publish = 'PUBLISH'
if ARGV[5] == 's' then
  publish = 'S' .. publish
end
local heard = redis.call(publish, ARGV[3], t)
if ARGV[7] == 'c' then
  return {0, heard}
end
return 0
