-- uses: publish, ownedToken, set, leave, grantFirst
-- multirelease: the final release of several locks of one slot in one call (a multi-lock's
-- Unlock), each exactly as release.lua releases every hold of its owner: the last token is
-- kept, and the lock is granted to the first live client in its queue, or announced free.
-- KEYS       triples, one per lock: the lock key, its queue <key>:q, its entries <key>:w
-- ARGV[1]    milliseconds to keep the last token after the release
-- ARGV[2]    "s" to announce with SPUBLISH (Redis Cluster), else PUBLISH
-- ARGV[3i .. 3i+2], for lock i: its owner secret, its token floor (the lease's token; the kept
--            token is the larger of the lock's and this one; 0: none), and a client id whose
--            queue entry to drop as well ("" for none)
-- Reply      per lock: 0 released (and granted or announced), -1 not held by that owner (its
--            entry, if given, is dropped all the same)
-- Announcements as release.lua's: "g <token> <entry id> <window ms>" to the grantee's client
-- channel <key>:rel:<client id> (and to the client queued next only as grantFirst says), "<token>" for a
-- release that granted nothing; either also on the release channel <key>:rel when anyone may
-- listen there (a subscriber of it, or, not on a Cluster, of any pattern). On a server out of memory the releases still work, as release.lua's do.
-- The announcements on the release channels are sent at the end, where anyone may listen:
-- one PUBSUB call for all the channels (and one NUMPAT), not one per lock.
local channels, payloads = {}, {}
local function defer(rel, payload)
  channels[#channels + 1] = rel
  payloads[#payloads + 1] = payload
end

local out = {}
local retms = tonumber(ARGV[1])
for i = 1, #KEYS / 3 do
  local k, q, w = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local o, floor, leaving = ARGV[3 * i], tonumber(ARGV[3 * i + 1]), ARGV[3 * i + 2]
  local rel = k .. ':rel'
  local t = ownedToken(redis.call('GET', k), o)
  if not t then
    leave(q, w, leaving)
    out[i] = -1
  else
    if floor and floor > tonumber(t) then
      t = string.format('%d', floor)
    end
    leave(q, w, leaving)
    out[i] = 0
    -- The first live entry in the queue gets the lock: its SET is the release's only one.
    local win, _, msg = grantFirst(k, q, w, rel, ARGV[2], tonumber(t))
    if not win then
      set(k, retms, '- ' .. t .. ' 0', 'PX', ARGV[1])
    end
    defer(rel, win and msg or t)
  end
end
if #channels > 0 then
  local counts
  local patterns = false
  if ARGV[2] == 's' then
    counts = redis.call('PUBSUB', 'SHARDNUMSUB', unpack(channels))
  else
    counts = redis.call('PUBSUB', 'NUMSUB', unpack(channels))
    patterns = redis.call('PUBSUB', 'NUMPAT') > 0
  end
  for i = 1, #channels do
    if patterns or counts[2 * i] > 0 then
      publish(ARGV[2], channels[i], payloads[i])
    end
  end
end
return out
