-- release: give up one hold, or all of them, if and only if the caller owns the lock; a final
-- release grants the lock to the first live client in the queue, if any.
-- KEYS[1]  lock key
-- KEYS[2]  queue: <lock key>:q (see acquire.lua)
-- KEYS[3]  queue entries: <lock key>:w
-- ARGV[1]  owner secret
-- ARGV[2]  milliseconds to keep the last token after the final release
-- ARGV[3]  release channel: <lock key>:rel (a client's own channel is <lock key>:rel:<client id>)
-- ARGV[4]  "1" to drop every hold at once, "0" to drop one
-- ARGV[5]  "s" to announce with SPUBLISH (Redis Cluster, sharded pub/sub), else PUBLISH
-- ARGV[6]  a token floor (quorum mode, or a holder that got the lock by a local handoff): the
--          token kept after the final release is the larger of the lock's token and this one
-- ARGV[7]  optional: a client id whose queue entry to drop as well (a client whose waiters all
--          left: with its entry's owner as ARGV[1], this also gives back a grant it never took)
-- ARGV[8]  optional, the adaptive lease (ARGV[7] is then given, "" for none): the hold
--          record's retention in ms. A final release then records the hold in the name's hold
--          record KEYS[4] (<lock key>:h), which expires after that long without one. The hold
--          runs from the lock's token (the server's time of the acquisition, in µs) to now.
--          When the caller no longer owns the lock (its lease ran out first, or was taken from
--          it), a release of every hold ("1") records it too, from the token floor ARGV[6]
--          (the lease's token), so that a lease too short for its hold is learnt from.
--          Record: "<count> <typical µs> <high µs> <last µs>", the holds recorded, their
--          weighted average (0.8 × the old + 0.2 × the new hold; the first hold sets it), their
--          high-water mark (the larger of the new hold and 0.99 × the old mark) and the last.
-- Reply    holds left (0 = released), or -1 when the caller does not own the lock.
-- Announcements: "g <token> <entry id> <window ms>" for a grant: the lock now belongs to that
-- entry's owner for the window (its client then renews it), with a new token. It goes to the
-- grantee's client channel and to the channel of the client queued next (which watches the
-- grant: if the grantee never renews, the grant lapses and that client tries). "<token>" for
-- a release that granted nothing. Either also goes to the release channel, when anyone listens
-- there (PUBSUB NUMSUB, NUMPAT): waiting clients do not, so a busy lock costs one or two messages per
-- release, not one per waiting client.
--
-- A release only ever frees memory, so it must work on a server out of memory too (maxmemory
-- reached under the noeviction policy). There Redis refuses a script's first write that may
-- need memory (SET), but not one that cannot (PEXPIRE), and lets a script that has written
-- finish. So a SET refused for memory is made again after a PEXPIRE of the same key (to
-- pexpire ms, or, when nil, to the key's remaining time). Having written, the script may go on
-- writing, so a final release still grants the lock to the first live queue entry; queue
-- entries themselves are neither made nor refreshed on a full server (their writes come first
-- in their scripts), so they lapse and the queue empties within a window.
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
local function publish(channel, payload)
  local cmd = 'PUBLISH'
  if ARGV[5] == 's' then
    cmd = 'S' .. cmd -- built at run time: some embedded test servers refuse unknown names at compile time
  end
  redis.call(cmd, channel, payload)
end
-- announce sends payload to the release channel if anyone may listen there: a subscriber of
-- the channel, or (not on a Cluster) of any pattern.
local function announce(payload)
  local listened
  if ARGV[5] == 's' then
    listened = redis.call('PUBSUB', 'SHARDNUMSUB', ARGV[3])[2] > 0
  else
    listened = redis.call('PUBSUB', 'NUMSUB', ARGV[3])[2] > 0 or redis.call('PUBSUB', 'NUMPAT') > 0
  end
  if listened then
    publish(ARGV[3], payload)
  end
end
-- client returns the channel of the client whose entry id ("<client id>.<sequence>") is id.
local function client(id)
  return ARGV[3] .. ':' .. (string.match(id, '^([^.]*)%.') or id)
end
local function leave()
  if ARGV[7] and ARGV[7] ~= '' then
    redis.call('ZREM', KEYS[2], ARGV[7])
    redis.call('HDEL', KEYS[3], ARGV[7])
  end
end
-- record adds the hold that began at start (µs, the server's clock) to the hold record. It is
-- made only with ARGV[8]: other releases pay nothing for it. Its write comes after the release's
-- and is skipped on a server out of memory.
local record
if ARGV[8] then
  record = function(start)
    local now = redis.call('TIME')
    local hold = math.max(0, now[1] * 1000000 + now[2] - (start or 0))
    local n, avg, high = 0, hold, hold
    local r = redis.call('GET', KEYS[4])
    local c, a, h = string.match(r or '', '^(%d+) (%d+) (%d+)')
    if c then
      n = tonumber(c)
      avg = math.floor(0.8 * tonumber(a) + 0.2 * hold + 0.5)
      high = math.max(hold, math.floor(0.99 * tonumber(h)))
    end
    redis.pcall('SET', KEYS[4], string.format('%d %d %d %d', n + 1, avg, high, hold), 'PX', ARGV[8])
  end
end

local v = redis.call('GET', KEYS[1])
local o = ARGV[1]
if not v or string.byte(v, #o + 1) ~= 32 or string.find(v, o, 1, true) ~= 1 then
  leave()
  if record and ARGV[4] == '1' and tonumber(ARGV[6]) > 0 then
    record(tonumber(ARGV[6]))
  end
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
local start = tonumber(t)
if floor and floor > start then
  t = string.format('%d', floor)
end
set(tonumber(ARGV[2]), '- ' .. t .. ' 0', 'PX', ARGV[2])
leave()
if record then
  record(start)
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  local now = redis.call('TIME')
  local ms = now[1] * 1000 + math.floor(now[2] / 1000)
  while true do
    local id = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not id then
      break
    end
    local e = redis.call('HGET', KEYS[3], id)
    if e and tonumber(string.sub(e, 1, string.find(e, ' ', 1, true) - 1)) > ms then
      local win, owner, meta = string.match(e, '^%d+ (%d+) (%S+) (.*)$')
      local token = now[1] * 1000000 + now[2]
      if tonumber(t) + 16 > token then
        token = tonumber(t) + 16
      end
      local r = redis.pcall('SET', KEYS[1], owner .. ' ' .. string.format('%d', token) .. ' 1 ' .. meta, 'PX', win)
      if type(r) == 'table' and r.err then
        break -- out of memory: leave it released
      end
      redis.call('ZREM', KEYS[2], id)
      redis.call('HDEL', KEYS[3], id)
      local msg = 'g ' .. string.format('%d', token) .. ' ' .. id .. ' ' .. win
      local to = client(id)
      publish(to, msg)
      local nxt = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
      if nxt and client(nxt) ~= to then
        publish(client(nxt), msg)
      end
      announce(msg)
      return 0
    end
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
  end
end
announce(t)
return 0
