-- uses: publish, grantNotice
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
-- lease, free (no key, or released) and with no queue, is taken with GET, EXISTS, TIME and SET.
local v0
if ARGV[1] ~= '' then
  v0 = redis.call('GET', KEYS[1])
  if ARGV[4] ~= 'r' and (ARGV[11] or '') == '' and (not v0 or (string.byte(v0, 1) == 45 and string.byte(v0, 2) == 32))
    and redis.call('EXISTS', KEYS[2]) == 0 then
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
-- (library)
local batch = ARGV[1] == ''
-- The server's time, read once per call when first needed: µs (and as text), ms.
local now, nowtext, nowms
local function clock()
  if not now then
    local t = redis.call('TIME')
    local s, us = tonumber(t[1]), tonumber(t[2])
    now, nowms = s * 1000000 + us, s * 1000 + math.floor(us / 1000)
    nowtext = string.format('%d', now)
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
local queues = {KEYS[2]} -- of every lock of the call
if batch then
  queues = suffixed(':q')
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
    local chans = {rel}
    if batch then
      chans = suffixed(':rel')
    end
    listeners = {}
    local r = redis.call('PUBSUB', 'NUMSUB', unpack(chans))
    for i = 1, #r, 2 do
      listeners[r[i]] = r[i + 1]
    end
  end
  return (listeners[rel] or 1) > 0
end
-- grant announces a grant to entry id as release.lua does: to its client, to the client
-- queued next (queue q), and on the release channel rel if anyone listens there.
local function grant(q, rel, pub, id, msg)
  grantNotice(pub, q, rel, id, msg)
  if listened(pub, rel) then
    publish(pub, rel, msg)
  end
end
-- enqueue queues (or refreshes) entry id of owner in queue q and entries w, now.
local function enqueue(q, w, id, owner, meta, win, place)
  clock()
  local n = tonumber(win)
  redis.call('ZADD', q, 'NX', tonumber(place or '') or now, id)
  redis.call('HSET', w, id, string.format('%d', nowms + n) .. ' ' .. win .. ' ' .. owner .. ' ' .. meta)
  noqueue = false
  local keep = math.max(n, redis.call('PTTL', q))
  redis.call('PEXPIRE', q, keep)
  redis.call('PEXPIRE', w, keep)
end

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
      if mode == 'q' then
        enqueue(q or key .. ':q', w or key .. ':w', id, owner, meta, win, place)
      end
      return 0, redis.call('PTTL', key), t, lease
    end
  elseif mode == 'r' then
    return 0, -2, 0
  end
  clock()
  local token, text = now, nowtext
  if last and last + 16 > token then
    token = last + 16
    text = string.format('%d', token)
  end
  q = q or key .. ':q'
  if queued(q) then
    -- The first queued client whose entry has not expired, dropping the expired ones before it.
    w = w or key .. ':w'
    local first, e
    while true do
      first = redis.call('ZRANGE', q, 0, 0)[1]
      if not first then
        break
      end
      e = redis.call('HGET', w, first)
      if e and tonumber(string.sub(e, 1, string.find(e, ' ', 1, true) - 1)) > nowms then
        break
      end
      redis.call('ZREM', q, first)
      redis.call('HDEL', w, first)
    end
    -- An entry id is "<client id>.<sequence>": an entry of the caller's own client (an older
    -- registration it has withdrawn, or not yet) does not stand before the caller.
    local mine = string.match(id, '^[^.]*%.')
    if first and mine and string.sub(first, 1, #mine) == mine then
      for _, other in ipairs(redis.call('ZRANGE', q, 0, -1)) do
        if string.sub(other, 1, #mine) == mine then
          redis.call('ZREM', q, other)
          redis.call('HDEL', w, other)
        end
      end
      first = nil
    end
    if first then
      -- A client queued before the caller: the lock is its until its entry would have lapsed
      -- (at most the acceptance window: a grant to a client that died waiting costs the others
      -- no more than its entry would have).
      local eexp, eowner, emeta = string.match(e, '^(%d+) %d+ (%S+) (.*)$')
      local ewin = string.format('%d', math.max(tonumber(eexp) - nowms, 1))
      redis.call('ZREM', q, first)
      redis.call('HDEL', w, first)
      redis.call('SET', key, eowner .. ' ' .. text .. ' 1 ' .. emeta, 'PX', ewin)
      grant(q, rel or key .. ':rel', pub, first, 'g ' .. text .. ' ' .. first .. ' ' .. ewin)
      if mode == 'q' then
        enqueue(q, w, id, owner, meta, win, place)
      end
      return 0, tonumber(ewin), token, lease
    end
  end
  redis.call('SET', key, owner .. ' ' .. text .. ' 1 ' .. meta, 'PX', lease or ttl)
  return 1, token, 1, lease
end

-- read does one lock of a batch (its value read first, so that an error reading it is that
-- lock's).
local function read(key, q, owner, ttl, meta, mode, pub, id, win, lo, hi)
  return acquire(redis.call('GET', key), key, q, nil, nil, owner, ttl, meta, mode, nil, pub, id, win, nil, lo, hi)
end

if not batch then
  return {acquire(v0, KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2],
    ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11])}
end
local out, i, g = {}, 0, 2
while g <= #ARGV do
  local ttl, meta, mode, pub, win, lo, hi = ARGV[g], ARGV[g + 1], ARGV[g + 2], ARGV[g + 3], ARGV[g + 4], ARGV[g + 5], ARGV[g + 6]
  local n = tonumber(ARGV[g + 7])
  for p = g + 8, g + 6 + 2 * n, 2 do
    i = i + 1
    local key = KEYS[i]
    local ok, a, b, c, d = pcall(read, key, queues[i], ARGV[p], ttl, meta, mode, pub, ARGV[p + 1], win, lo, hi)
    if not ok then
      a, b, c, d = -1, 0, 0, 0
    end
    local o = #out
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = a, b, c, d or 0
  end
  g = g + 8 + 2 * n
end
return out
