-- uses: publish, grantNotice
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
-- channel <key>:rel:<client id> and to the channel of the client queued next, "<token>" for a
-- release that granted nothing; either also on the release channel <key>:rel when anyone may
-- listen there (a subscriber of it, or, not on a Cluster, of any pattern). On a server out of memory the releases still work, as release.lua's do.
-- The announcements on the release channels are sent at the end, where anyone may listen:
-- one PUBSUB call for all the channels (and one NUMPAT), not one per lock.
local channels, payloads = {}, {}
local function announce(rel, payload)
  channels[#channels + 1] = rel
  payloads[#payloads + 1] = payload
end
-- set is release.lua's: a SET refused for memory is made again after a PEXPIRE of the key.
local function set(k, pexpire, ...)
  local r = redis.pcall('SET', k, ...)
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 3) == 'OOM' and pexpire > 0 then
      redis.call('PEXPIRE', k, pexpire)
    end
    redis.call('SET', k, ...)
  end
end

local out = {}
local now
for i = 1, #KEYS / 3 do
  local k, q, w = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local o, floor, leaving = ARGV[3 * i], tonumber(ARGV[3 * i + 1]), ARGV[3 * i + 2]
  local rel = k .. ':rel'
  local function leave()
    if leaving ~= '' then
      redis.call('ZREM', q, leaving)
      redis.call('HDEL', w, leaving)
    end
  end
  local v = redis.call('GET', k)
  local s2 = v and string.byte(v, #o + 1) == 32 and string.find(v, o, 1, true) == 1 and string.find(v, ' ', #o + 2, true)
  if not s2 then
    leave()
    out[i] = -1
  else
    local t = string.sub(v, #o + 2, s2 - 1)
    if floor and floor > tonumber(t) then
      t = string.format('%d', floor)
    end
    set(k, tonumber(ARGV[1]), '- ' .. t .. ' 0', 'PX', ARGV[1])
    leave()
    out[i] = 0
    local granted = false
    if redis.call('EXISTS', q) == 1 then
      now = now or redis.call('TIME')
      local ms = now[1] * 1000 + math.floor(now[2] / 1000)
      while true do
        local id = redis.call('ZRANGE', q, 0, 0)[1]
        if not id then
          break
        end
        local e = redis.call('HGET', w, id)
        if e and tonumber(string.sub(e, 1, string.find(e, ' ', 1, true) - 1)) > ms then
          -- The lock is the entry's owner's until its entry would have lapsed (at most the window).
          local exp, owner, meta = string.match(e, '^(%d+) %d+ (%S+) (.*)$')
          local win = string.format('%d', math.max(tonumber(exp) - ms, 1))
          local token = now[1] * 1000000 + now[2]
          if tonumber(t) + 16 > token then
            token = tonumber(t) + 16
          end
          local r = redis.pcall('SET', k, owner .. ' ' .. string.format('%d', token) .. ' 1 ' .. meta, 'PX', win)
          if type(r) == 'table' and r.err then
            break -- out of memory: leave it released
          end
          redis.call('ZREM', q, id)
          redis.call('HDEL', w, id)
          local msg = 'g ' .. string.format('%d', token) .. ' ' .. id .. ' ' .. win
          grantNotice(ARGV[2], q, rel, id, msg)
          announce(rel, msg)
          granted = true
          break
        end
        redis.call('ZREM', q, id)
        redis.call('HDEL', w, id)
      end
    end
    if not granted then
      announce(rel, t)
    end
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
