-- uses: publish, grantNotice
-- release: give up one hold, or all of them, if and only if the caller owns the lock; a final
-- release grants the lock to the first live client in the queue, if any. For one lock, or for
-- several at once (a batch, below).
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
-- Announcements: "g <token> <entry id> <ms>" for a grant: the lock now belongs to that entry's
-- owner until its entry would have lapsed (ms: at most the window; its client then renews it),
-- with a new token. It goes to the
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
--
-- A batch (a client's concurrent releases in one call): ARGV[1] is "" (never an owner), KEYS
-- the lock keys only, one per lock (the script derives <key>:q, <key>:w, <key>:h and the
-- release channel <key>:rel, so it runs on one server, never on a Cluster), ARGV[2] the
-- retention in ms, and after it come groups, each of locks that share their settings: "1" or
-- "0" (every hold or one), "s" or "p", the hold record's retention in ms ("" for none), the
-- number n of its locks, then n triples: the lock's owner secret, its token floor and the
-- client id whose entry to drop ("" for none). Locks take KEYS in the order of the groups and
-- triples. Each lock is done in turn exactly as a call of its own with those arguments would
-- do it, and the reply holds one integer per lock, in that order: its reply as above, or -2
-- when doing that lock raised an error (the locks before and after it are done all the same;
-- send that lock alone to learn the error).
-- What several locks of a call need is read once per call, when first needed: the server's
-- time (TIME), whether any of their queues exists (one EXISTS of them all: while
-- none does, no lock asks again; a release never makes a queue), and who may listen on their
-- release channels (PUBSUB NUMPAT, then one PUBSUB NUMSUB of all the channels).
--
-- The fast path comes first, before any function is built: the final release of one lock (not
-- a batch) by its owner, with no queue, no entry to drop and no hold record, is GET, EXISTS,
-- SET and the release channel's listener check. Anything else, or a SET refused (out of
-- memory), goes the full way below, which has written nothing yet then.
local v0
if ARGV[1] ~= '' then
  local o = ARGV[1]
  v0 = redis.call('GET', KEYS[1])
  if v0 and string.byte(v0, #o + 1) == 32 and string.find(v0, o, 1, true) == 1 and (ARGV[7] or '') == ''
    and (ARGV[8] or '') == '' then
    local s2 = string.find(v0, ' ', #o + 2, true)
    local s3 = s2 and string.find(v0, ' ', s2 + 1, true)
    if s2 and (ARGV[4] == '1' or string.sub(v0, s2 + 1, (s3 or 0) - 1) == '1') and redis.call('EXISTS', KEYS[2]) == 0 then
      local t, floor = string.sub(v0, #o + 2, s2 - 1), ARGV[6]
      if floor and floor ~= '' and floor ~= t and tonumber(floor) > tonumber(t) then
        t = string.format('%d', tonumber(floor))
      end
      local r = redis.pcall('SET', KEYS[1], '- ' .. t .. ' 0', 'PX', ARGV[2])
      if type(r) ~= 'table' or not r.err then
        local heard
        if ARGV[5] == 's' then
          heard = redis.call('PUBSUB', 'SHARDNUMSUB', ARGV[3])[2] > 0
        else
          heard = redis.call('PUBSUB', 'NUMPAT') > 0 or redis.call('PUBSUB', 'NUMSUB', ARGV[3])[2] > 0
        end
        if heard then
          redis.call(ARGV[5] == 's' and 'SPUBLISH' or 'PUBLISH', ARGV[3], t)
        end
        return 0
      end
    end
  end
end
-- (library)
local batch = ARGV[1] == ''
-- The server's time, read once per call when first needed: µs, ms.
local now, nowms
local function clock()
  if not now then
    local t = redis.call('TIME')
    local s, us = tonumber(t[1]), tonumber(t[2])
    now, nowms = s * 1000000 + us, s * 1000 + math.floor(us / 1000)
  end
end
-- suffixed returns the key of every lock of the call with suffix (its queue, its channel).
local function suffixed(suffix)
  local out = {}
  for i, key in ipairs(KEYS) do
    out[i] = key .. suffix
  end
  return out
end
local queues, channels = {KEYS[2]}, {ARGV[3]} -- of every lock of the call
if batch then
  queues, channels = suffixed(':q'), suffixed(':rel')
end
-- queued reports whether the queue q (of a lock of this call) may exist: false only when it
-- surely does not.
local noqueue
local function queued(q)
  if noqueue == nil then
    local qs = queues
    local n = redis.call('EXISTS', unpack(qs))
    noqueue = n == 0
    if n == #qs then
      return true
    end
  end
  if noqueue then
    return false
  end
  return redis.call('EXISTS', q) == 1
end
-- listened reports whether anyone may listen on the release channel rel (of a lock of this
-- call): on a Cluster a subscriber of it (sharded), else a subscriber of any pattern or of it.
local patterns, listeners
local function listened(pub, rel)
  if pub == 's' then
    return redis.call('PUBSUB', 'SHARDNUMSUB', rel)[2] > 0
  end
  if patterns == nil then
    patterns = redis.call('PUBSUB', 'NUMPAT') > 0
  end
  if patterns then
    return true
  end
  if not listeners then
    listeners = {}
    local r = redis.call('PUBSUB', 'NUMSUB', unpack(channels))
    for i = 1, #r, 2 do
      listeners[r[i]] = r[i + 1]
    end
  end
  return (listeners[rel] or 1) > 0
end
-- set sets key (see above): a SET refused for memory is made again after a PEXPIRE. Once a
-- write of the call succeeded, none is refused any more: plain calls then.
local wrote
local function set(key, pexpire, ...)
  if wrote then
    redis.call('SET', key, ...)
    return
  end
  local r = redis.pcall('SET', key, ...)
  if type(r) == 'table' and r.err then
    local ms = pexpire or redis.call('PTTL', key)
    if string.sub(r.err, 1, 3) == 'OOM' and ms > 0 then
      redis.call('PEXPIRE', key, ms)
    end
    redis.call('SET', key, ...)
  end
  wrote = true
end
-- announce sends payload to the release channel rel if anyone may listen there.
local function announce(pub, rel, payload)
  if listened(pub, rel) then
    publish(pub, rel, payload)
  end
end
-- leave drops entry id (if not empty) from queue q and its entries w.
local function leave(q, w, id)
  if id and id ~= '' then
    redis.call('ZREM', q, id)
    redis.call('HDEL', w, id)
  end
end
-- record adds a hold that began at start (µs, the server's clock) to the hold record h, kept
-- for keep ms. Its write comes after the release's and is skipped on a server out of memory.
local function record(h, keep, start)
  clock()
  local hold = math.max(0, now - (start or 0))
  local n, avg, high = 0, hold, hold
  local r = redis.call('GET', h)
  local c, a, hi = string.match(r or '', '^(%d+) (%d+) (%d+)')
  if c then
    n = tonumber(c)
    avg = math.floor(0.8 * tonumber(a) + 0.2 * hold + 0.5)
    high = math.max(hold, math.floor(0.99 * tonumber(hi)))
  end
  redis.pcall('SET', h, string.format('%d %d %d %d', n + 1, avg, high, hold), 'PX', keep)
end

-- release does one lock, with the keys and arguments above (v: the lock's value, read by the
-- caller; q, w, h: KEYS[2], KEYS[3], KEYS[4], or nil for <key>:q, <key>:w, <key>:h), and
-- returns its reply.
local function release(v, key, q, w, h, o, ret, retms, rel, all, pub, floor, id, keep)
  if keep == '' then
    keep = nil -- no hold record: other releases pay nothing for it
  end
  if not v or string.byte(v, #o + 1) ~= 32 or string.find(v, o, 1, true) ~= 1 then
    if id and id ~= '' then
      leave(q or key .. ':q', w or key .. ':w', id)
    end
    if keep and all == '1' and tonumber(floor) > 0 then
      record(h or key .. ':h', keep, tonumber(floor))
    end
    return -1
  end
  -- "<owner> <token> <holds> <description>", read with string.find/sub (cheaper than a pattern)
  local s2 = string.find(v, ' ', #o + 2, true)
  if not s2 then
    return -1
  end
  local t = string.sub(v, #o + 2, s2 - 1)
  if all ~= '1' then
    local s3 = string.find(v, ' ', s2 + 1, true)
    local n = tonumber(string.sub(v, s2 + 1, (s3 or 0) - 1)) or 1
    if n > 1 then
      n = n - 1
      local m = ''
      if s3 then
        m = string.sub(v, s3 + 1)
      end
      set(key, nil, o .. ' ' .. t .. ' ' .. n .. ' ' .. m, 'KEEPTTL')
      return n
    end
  end
  local start = t
  if floor ~= t and floor and floor ~= '' and tonumber(floor) > tonumber(t) then
    t = string.format('%d', tonumber(floor))
  end
  set(key, retms, '- ' .. t .. ' 0', 'PX', ret)
  q = q or key .. ':q'
  if id and id ~= '' then
    w = w or key .. ':w'
    leave(q, w, id)
  end
  if keep then
    record(h or key .. ':h', keep, tonumber(start))
  end
  if queued(q) then
    w = w or key .. ':w'
    clock()
    while true do
      local first = redis.call('ZRANGE', q, 0, 0)[1]
      if not first then
        break
      end
      local e = redis.call('HGET', w, first)
      if e and tonumber(string.sub(e, 1, string.find(e, ' ', 1, true) - 1)) > nowms then
        -- The lock is the entry's owner's until its entry would have lapsed (at most the window).
        local exp, owner, meta = string.match(e, '^(%d+) %d+ (%S+) (.*)$')
        local win = string.format('%d', math.max(tonumber(exp) - nowms, 1))
        local token = now
        if tonumber(t) + 16 > token then
          token = tonumber(t) + 16
        end
        local r = redis.pcall('SET', key, owner .. ' ' .. string.format('%d', token) .. ' 1 ' .. meta, 'PX', win)
        if type(r) == 'table' and r.err then
          break -- out of memory: leave it released
        end
        redis.call('ZREM', q, first)
        redis.call('HDEL', w, first)
        local msg = 'g ' .. string.format('%d', token) .. ' ' .. first .. ' ' .. win
        rel = rel or key .. ':rel'
        grantNotice(pub, q, rel, first, msg)
        announce(pub, rel, msg)
        return 0
      end
      redis.call('ZREM', q, first)
      redis.call('HDEL', w, first)
    end
  end
  announce(pub, rel or key .. ':rel', t)
  return 0
end

-- read does one lock of a batch (its value read first, so that an error reading it is that
-- lock's).
local function read(key, q, o, ret, retms, rel, all, pub, floor, id, keep)
  return release(redis.call('GET', key), key, q, nil, nil, o, ret, retms, rel, all, pub, floor, id, keep)
end

if not batch then
  return release(v0, KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2],
    tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
end
local out, ret, retms, i, g = {}, ARGV[2], tonumber(ARGV[2]), 0, 3
while g <= #ARGV do
  local all, pub, keep = ARGV[g], ARGV[g + 1], ARGV[g + 2]
  local n = tonumber(ARGV[g + 3])
  for p = g + 4, g + 1 + 3 * n, 3 do
    i = i + 1
    local key = KEYS[i]
    local ok, r = pcall(read, key, queues[i], ARGV[p], ret, retms, channels[i], all, pub, ARGV[p + 1], ARGV[p + 2], keep)
    if not ok then
      r = -2
    end
    out[i] = r
  end
  g = g + 4 + 3 * n
end
return out
