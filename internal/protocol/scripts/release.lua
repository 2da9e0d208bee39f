-- uses: clock, ownedToken, set, leave, queued, announce, grantFirst, batched
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
-- grantee's client channel; the clients queued behind learn of the grant at their next
-- entry refresh (queue.lua reports how long the lock is granted for; if the grantee never
-- renews, the grant lapses and the next of them tries), or, when the grantee's entry had less
-- than two thirds of its window left, the client queued next is sent it too (grantFirst). "<token>" for a release that granted
-- nothing. Either also goes to the release channel, when anyone listens
-- there (PUBSUB NUMSUB, NUMPAT): waiting clients do not, so a busy lock costs one or two messages per
-- release, not one per waiting client.
--
-- A release only ever frees memory, so it must work on a server out of memory too (maxmemory
-- reached under the noeviction policy). There Redis refuses a script's first write that may
-- need memory (SET), but not one that cannot (PEXPIRE), and lets a script that has written
-- finish. So a SET refused for memory is made again after a PEXPIRE of the same key (to
-- pexpire ms, or, when nil, to the key's remaining time). A final release that grants removes
-- the grantee's entry (writes that need no memory) before its one SET, so it still grants the
-- lock to the first live queue entry; queue
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
  local t, s2 = ownedToken(v, o)
  if t == false then
    if id and id ~= '' then
      leave(q or key .. ':q', w or key .. ':w', id)
    end
    if keep and all == '1' and tonumber(floor) > 0 then
      record(h or key .. ':h', keep, tonumber(floor))
    end
    return -1
  end
  if not t then
    return -1
  end
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
  if id and id ~= '' then
    leave(q or key .. ':q', w or key .. ':w', id)
  end
  rel = rel or key .. ':rel'
  q = q or key .. ':q'
  -- The first live entry in the queue gets the lock: its SET is the release's only one.
  local win, _, msg
  if queued(q) then
    win, _, msg = grantFirst(key, q, w or key .. ':w', rel, pub, tonumber(t))
  end
  if not win then
    set(key, retms, '- ' .. t .. ' 0', 'PX', ret)
    msg = t
  end
  if keep then
    record(h or key .. ':h', keep, tonumber(start))
  end
  announce(pub, rel, msg, batch)
  return 0
end

if not batch then
  return release(v0, KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2],
    tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
end
-- (library: batched)
-- A batch: the retention, then groups of 3 settings and the count, then triples (owner, token
-- floor, entry id). A lock's value is read in its own call, so that an error reading it is that
-- lock's.
local ret, retms = ARGV[2], tonumber(ARGV[2])
return batched(3, 3, 3, false, -2, function(i, g, p)
  return release(redis.call('GET', KEYS[i]), KEYS[i], queues[i], nil, nil, ARGV[p], ret, retms, nil,
    ARGV[g], ARGV[g + 1], ARGV[p + 1], ARGV[p + 2], ARGV[g + 2])
end)
