-- acquire: take the lock, or re-enter it as the same owner, in one atomic step.
-- KEYS[1]  lock key: <prefix>{<name>}
-- ARGV[1]  owner secret of the caller (no spaces)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  holder description (host, pid, process start, label)
-- ARGV[4]  "r" to re-enter only: never take a free lock (a lease that lost its lock must not
--          silently get a new one with a different token)
-- Value    "<owner> <token> <holds> <description>" while held, "- <token> 0" after a release
-- Reply    {1, token, holds}     taken (holds = 1) or re-entered by the same owner (holds > 1)
--          {0, pttl, token}      held by another owner: its remaining lease (ms) and its token
--          {0, -2, 0}            re-entry asked for, but the lock is not the caller's
-- A new token is max(last token + 16, server time in microseconds): the 15 tokens after a
-- holder's are for the holders its client passes the lock to without the server (a local
-- handoff, see handover.lua), and a ForceUnlock keeps only the server's token. The last token
-- outlives a release (see release.lua), so tokens keep increasing within that window; once the
-- key is gone, the server clock alone keeps them increasing.
local v = redis.call('GET', KEYS[1])
local last
if v then
  -- Fields are parsed with string.byte/find/sub where possible: pattern matching costs the
  -- server more, and these are the hottest paths (a free name, a released one, a busy one).
  local o = ARGV[1]
  if string.byte(v, #o + 1) == 32 and string.find(v, o, 1, true) == 1 then
    -- held by the caller: re-enter
    local t, n, m = string.match(v, '^%S+ (%d+) (%d+) ?(.*)$')
    n = tonumber(n) + 1
    redis.call('SET', KEYS[1], o .. ' ' .. t .. ' ' .. n .. ' ' .. m, 'PX', ARGV[2])
    return {1, tonumber(t), n}
  end
  if ARGV[4] == 'r' then
    return {0, -2, 0}
  end
  if string.byte(v, 1) == 45 and string.byte(v, 2) == 32 then
    last = tonumber(string.sub(v, 3, -3)) -- released: "- <token> 0"
  end
  if not last then
    -- held by another owner (or not a lock value): its remaining lease and its token
    local t = 0
    local s1 = string.find(v, ' ', 1, true)
    if s1 then
      local s2 = string.find(v, ' ', s1 + 1, true)
      t = tonumber(string.sub(v, s1 + 1, (s2 or 0) - 1)) or 0
    end
    return {0, redis.call('PTTL', KEYS[1]), t}
  end
end
local now = redis.call('TIME')
local token = now[1] * 1000000 + now[2]
if last and last + 16 > token then
  token = last + 16
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. string.format('%d', token) .. ' 1 ' .. ARGV[3], 'PX', ARGV[2])
return {1, token, 1}
