-- uses: publish, clientChannel, set, grantFirst
-- forceunlock: release a lock whoever holds it (an administrator's "dlock unlock --force"),
-- exactly as release.lua does for its owner: the last token is kept, and the lock is granted
-- to the first live entry of its queue, or announced free.
-- KEYS[1]  lock key
-- KEYS[2]  queue: <lock key>:q (see acquire.lua)
-- KEYS[3]  its entries: <lock key>:w
-- ARGV[1]  milliseconds to keep the last token (60000)
-- ARGV[2]  release channel: <prefix>{<name>}:rel
-- ARGV[3]  optional: "s" to announce with SPUBLISH (Redis Cluster), else PUBLISH
-- Reply    {value, pttl, woken}
--          value  the lock's value before the call (nil when there is no key)
--          pttl   its remaining lease before the call, in milliseconds
--          woken  -1 when nothing was released (not held, or not a dlock value); otherwise the
--                 number of clients that received the announcement: the grantee's client, when
--                 the lock was granted, and every listener of the release channel
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
-- As in release.lua: the first live entry gets the lock (its entry leaves first, so the SET is
-- not refused on a server out of memory); else the released value, which on such a server a
-- write that needs none lets through. A released value so always means an empty queue, which
-- acquire.lua's fast path relies on.
local n = 0
local win, _, msg = grantFirst(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3], tonumber(t))
if win then
  n = 1
else
  set(KEYS[1], tonumber(ARGV[1]), '- ' .. t .. ' 0', 'PX', ARGV[1])
  msg = t
end
n = n + publish(ARGV[3], ARGV[2], msg)
return {v, pttl, n}
