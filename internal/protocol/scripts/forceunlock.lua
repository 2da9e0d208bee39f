-- uses: publish, clientChannel, set
-- forceunlock: release a lock whoever holds it (an administrator's "dlock unlock --force"),
-- exactly as release.lua does for its owner: the last token is kept and waiters are woken.
-- KEYS[1]  lock key
-- KEYS[2]  queue: <lock key>:q (see acquire.lua)
-- ARGV[1]  milliseconds to keep the last token (60000)
-- ARGV[2]  release channel: <prefix>{<name>}:rel
-- ARGV[3]  optional: "s" to announce with SPUBLISH (Redis Cluster), else PUBLISH
-- Reply    {value, pttl, woken}
--          value  the lock's value before the call (nil when there is no key)
--          pttl   its remaining lease before the call, in milliseconds
--          woken  -1 when nothing was released (not held, or not a dlock value); otherwise the
--                 number of clients that received the release notice: every client queued
--                 (on its own channel, <release channel>:<client id>; the first of them to
--                 try gets the lock, or grants it to the first live entry) and every listener
--                 of the release channel
-- The holder's renewals, re-entries and Unlock fail from then on: its value is gone.
local v = redis.call('GET', KEYS[1])
local pttl = redis.call('PTTL', KEYS[1])
if not v then
  return {false, pttl, -1}
end
local o, t = string.match(v, '^(%S+) (%d+) %d+')
if not o or o == '-' then
  return {v, pttl, -1}
end
-- As in release.lua: on a server out of memory, a write that needs none lets the SET through.
set(KEYS[1], tonumber(ARGV[1]), '- ' .. t .. ' 0', 'PX', ARGV[1])
local n = 0
local seen = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local ch = clientChannel(ARGV[2], id)
  if not seen[ch] then
    seen[ch] = true
    n = n + publish(ARGV[3], ch, t)
  end
end
n = n + publish(ARGV[3], ARGV[2], t)
return {v, pttl, n}
