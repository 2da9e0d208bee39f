-- uses: released, holderToken, enqueue, queued, announce, nextToken, grantFirst, dropClient, batched
-- acquire: take the lock, re-enter it as the same owner, or queue for it, in one atomic step;
-- for one lock, or for several at once (a batch, below).
-- KEYS[1]  lock key: <prefix>{<name>}
-- KEYS[2]  queue: <lock key>:q, a sorted set of waiting clients' ids by arrival
-- KEYS[3]  queue entries: <lock key>:w, a hash of client id -> "<expiry ms> <window ms> <owner> <description>"
-- ARGV[1]  owner secret of the caller (no spaces)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  holder description (host, pid, process start, label)
-- ARGV[4]  mode: "r" to re-enter only (never take a free lock: a lease that lost its lock must
--          not silently get a new one with a different token); "q" to queue the caller's
--          client when the lock is held; "" for neither
-- ARGV[5]  release channel: <lock key>:rel (a grant is announced as release.lua does)
-- ARGV[6]  "s" to announce with SPUBLISH (Redis Cluster), else PUBLISH
-- ARGV[7]  the caller's client id (public; names its queue entry)
-- ARGV[8]  with "q": the acceptance window in ms: how long the queue entry lives unless
--          refreshed, and the lease a grant starts with
-- ARGV[9]  optional, with "q": the entry's place in the queue (a number; the server's time in
--          microseconds when absent or empty). In quorum mode the client gives the same place on
--          every server, so that every server orders the same clients the same way.
-- ARGV[10] optional, the adaptive lease: its least and ARGV[11] its greatest lease in ms. The
--          lease of a new hold (taken or claimed) is then chosen from the name's hold record
--          KEYS[4] (<lock key>:h, see release.lua) instead of ARGV[2]: three times its
--          high-water hold, within [ARGV[10], ARGV[11]]; ARGV[11] when the name has no record.
--          (ARGV[9] is then given, "" for the server's time.) Both "": a fixed lease.
-- Value    "<owner> <token> <holds> <description>" while held, "- <token> 0" after a release
-- Reply    {1, token, holds}     taken, re-entered (holds > 1), or claimed: the lock had been
--                                granted to the caller's queue entry (same owner)
--          {0, pttl, token}      held by another owner: its remaining lease (ms) and its token
--          {0, -2, 0}            re-entry asked for, but the lock is not the caller's
--          With ARGV[10], every reply but the last has a fourth element: the adaptive lease in
--          ms (for a refused caller, the lease a grant to its queue entry is to be renewed to).
-- A free lock goes to the first live entry of the queue, if any, ahead of the caller (a
-- grant, as release.lua makes), unless that entry is the caller's client's: the caller then
-- takes it, and its client's entries leave the queue.
-- A new token is max(last token + 16, server time in microseconds): the 15 tokens after a
-- holder's are for the holders its client passes the lock to without the server (a local
-- handoff, see handover.lua), and a ForceUnlock keeps only the server's token. The last token
-- outlives a release (see release.lua), so tokens keep increasing within that window; once the
-- key is gone, the server clock alone keeps them increasing.
--
-- A batch (a client's concurrent acquisitions in one call): ARGV[1] is "" (never an owner),
-- KEYS the lock keys only, one per lock (the script derives <key>:q, <key>:w, <key>:h and the
-- release channel <key>:rel, so it runs on one server, never on a Cluster), and after ARGV[1]
-- come groups, each of locks that share their settings: the lease in ms, the description, the
-- mode, "s" or "p", the acceptance window in ms ("" without "q"), the adaptive lease's least
-- and greatest ms ("" and "" for a fixed lease), the number n of its locks, then n pairs: the
-- lock's owner secret and its entry id ("" without "q"). Locks take KEYS in the order of the
-- groups and pairs. Each lock is done in turn exactly as a call of its own with those
-- arguments (the server's time as its place) would do it, and the reply is 4 integers per
-- lock, in that order: its reply as above, with 0 as the fourth element when there is none; or
-- {-1, 0, 0, 0} when doing that lock raised an error (the locks before and after it are done
-- all the same; send that lock alone to learn the error).
-- What several locks of a call need is read once per call, when first needed: the server's
-- time (TIME), whether any of their queues exists (one EXISTS of them all: while
-- none does, and no lock of the call has queued, no lock asks again), and who may listen on
-- their release channels (PUBSUB NUMPAT, then one PUBSUB NUMSUB of all the channels).
--
-- The fast path comes first, before any function is built: one lock (not a batch) with a fixed
-- lease, free and with no queue, is taken with GET, TIME and SET, and EXISTS of the queue when
-- there is no key. A released value ("- <token> 0", which stays for the token retention after
-- a release) means no queue: release.lua writes it only when no live entry is left to grant
-- the lock to (forceunlock.lua likewise), and nobody queues while the lock is free (an attempt
-- queues only when refused).
local v0
if ARGV[1] ~= '' then
  v0 = redis.call('GET', KEYS[1])
  if ARGV[4] ~= 'r' and (ARGV[11] or '') == '' and (v0 and string.byte(v0, 1) == 45 and string.byte(v0, 2) == 32
    or not v0 and redis.call('EXISTS', KEYS[2]) == 0) then
    local t = redis.call('TIME')
    local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local last = v0 and tonumber(string.sub(v0, 3, -3))
    if last and last + 16 > token then
      token = last + 16
    end
    redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. string.format('%d', token) .. ' 1 ' .. ARGV[3], 'PX', ARGV[2])
    return {1, token, 1}
  end
end
-- (library: released, holderToken, enqueue)
-- refuse answers a caller while another owner holds the lock (v, its value: not released): with
-- mode "q" its entry is queued, or refreshed; the reply has the holder's remaining lease and
-- token (and the lease, for an adaptive one).
local function refuse(v, key, q, w, owner, meta, mode, id, win, place, lease)
  if mode == 'q' then
    enqueue(q or key .. ':q', w or key .. ':w', id, owner, meta, win, place)
  end
  return 0, redis.call('PTTL', key), holderToken(v), lease
end
-- The next most common call, one lock with a fixed lease held by another owner, is answered
-- before the rest of the library is built: it needs none of it.
if v0 and ARGV[4] ~= 'r' and (ARGV[11] or '') == '' and not (string.byte(v0, #ARGV[1] + 1) == 32
  and string.find(v0, ARGV[1], 1, true) == 1) then
  local _, last = released(v0)
  if not last then
    return {refuse(v0, KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[3], ARGV[4], ARGV[7], ARGV[8], ARGV[9])}
  end
end
-- (library)
-- acquire does one lock, with the keys and arguments above (v: the lock's value, read by the
-- caller; q, w, h: KEYS[2], KEYS[3], KEYS[4], or nil for <key>:q, <key>:w, <key>:h), and
-- returns its reply's elements.
local function acquire(v, key, q, w, h, owner, ttl, meta, mode, rel, pub, id, win, place, lo, hi)
  local lease
  if hi and hi ~= '' then
    -- The adaptive lease: "<count> <typical µs> <high µs> <last µs>" (release.lua writes it).
    lease = tonumber(hi)
    local r = redis.call('GET', h or key .. ':h')
    local high = r and tonumber(string.match(r, '^%d+ %d+ (%d+)'))
    if high then
      lease = math.min(lease, math.max(tonumber(lo), math.ceil(3 * high / 1000)))
    end
  end
  local last
  if v then
    -- Fields are parsed with string.byte/find/sub where possible: pattern matching costs the
    -- server more, and these are the hottest paths (a free name, a released one, a busy one).
    if string.byte(v, #owner + 1) == 32 and string.find(v, owner, 1, true) == 1 then
      local t, n, m = string.match(v, '^%S+ (%d+) (%d+) ?(.*)$')
      if mode == 'r' then
        n = tonumber(n) + 1
        redis.call('SET', key, owner .. ' ' .. t .. ' ' .. n .. ' ' .. m, 'PX', ttl)
        return 1, tonumber(t), n
      end
      -- Granted to the caller's queue entry, and the caller had not heard: it takes its lease.
      redis.call('PEXPIRE', key, lease or ttl)
      return 1, tonumber(t), tonumber(n), lease
    end
    if mode == 'r' then
      return 0, -2, 0
    end
    local _
    _, last = released(v)
    if not last then
      -- held by another owner (or not a lock value)
      if mode == 'q' then
        noqueue = false -- the caller's queue now exists
      end
      return refuse(v, key, q, w, owner, meta, mode, id, win, place, lease)
    end
  elseif mode == 'r' then
    return 0, -2, 0
  end
  q = q or key .. ':q'
  -- A released value means an empty queue (see the fast path): only a missing key needs a look.
  if not v and queued(q) then
    -- A client queued before the caller gets the lock, unless it is of the caller's client (an
    -- entry id is "<client id>.<sequence>": an older registration it has withdrawn, or not
    -- yet): that client's entries then leave the queue, and the caller takes the lock.
    w, rel = w or key .. ':w', rel or key .. ':rel'
    local mine = string.match(id, '^[^.]*%.')
    local ewin, token, msg = grantFirst(key, q, w, rel, pub, last, mine)
    if ewin then
      announce(pub, rel, msg, batch)
      if mode == 'q' then
        enqueue(q, w, id, owner, meta, win, place)
        noqueue = false
      end
      return 0, tonumber(ewin), token, lease
    elseif ewin == false then
      dropClient(q, w, mine)
    end
  end
  local token, text = nextToken(last)
  redis.call('SET', key, owner .. ' ' .. text .. ' 1 ' .. meta, 'PX', lease or ttl)
  return 1, token, 1, lease
end

if not batch then
  return {acquire(v0, KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2],
    ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11])}
end
-- (library: batched)
-- A batch: groups of 7 settings and the count, then pairs (owner, entry id). A lock's value is
-- read in its own call, so that an error reading it is that lock's.
return batched(2, 7, 2, true, -1, function(i, g, p)
  return acquire(redis.call('GET', KEYS[i]), KEYS[i], queues[i], nil, nil, ARGV[p], ARGV[g], ARGV[g + 1],
    ARGV[g + 2], nil, ARGV[g + 3], ARGV[p + 1], ARGV[g + 4], nil, ARGV[g + 5], ARGV[g + 6])
end)
