-- uses: publish, clock
-- shared: the read-write lock and the semaphore. Every operation on them is in this one script
-- so that the grant walk, which most of them end with, exists once (docs/PROTOCOL.md,
-- "Read-write locks and semaphores").
--
-- One read-write lock or semaphore has three keys, all with its name as the Cluster hash tag:
--   B  <prefix>{<tag>}:rw or :sem  hash: per holder
--        <owner> -> "<lease end ms> <units> <holds> <token> <description>"
--      and "=u" the units held, "=t" the last token, "=s" the size (semaphore), "=e" a lease
--      end no later than the earliest holder's (when to look for holders that left without a
--      release), "=x" when B expires (ms, server clock), "=q" present when the queue may hold
--      entries, "=qx" the latest expiry set on the queue keys, "=k" present when the size was
--      set by a resize (sticky: B then has no expiry, and "=x" is NEVER)
--   Q  B:q  sorted set: waiting entry id -> its place (µs, server clock, at registration)
--   W  B:w  hash: entry id -> "<expiry ms> <window ms> <owner> <units> <description>"
-- A read-write lock counts as a semaphore of ALL units: a reader takes one, a writer takes
-- ALL, so a writer fits only when nobody holds it and a reader only while no writer does.
-- Every holder has its own lease end: one that is not renewed is dropped once it passes (purge),
-- the others keep theirs. B lives at least until the last lease end, and keeps the last token
-- (and a semaphore's size) for the retention after the last release; a semaphore whose size a
-- resize set ("=k") keeps B until a resize with size 0 (a reset) makes its size ordinary again.
-- A semaphore's stored size is the one every acquire uses; the size an acquire passes is only
-- the one stored when none is.
--
-- Each operation reads B with one HMGET and writes it with one HDEL and one HSET at most, so
-- that the common calls stay few: the cost of a script is mostly its calls.
--
-- ARGV[1] is the operation:
--   a  acquire  KEYS B Q W  ARGV owner, lease ms, description, mode, channel, pub, entry id,
--                           window ms, kind, units, size, parent owner, place
--   r  release  KEYS B Q W  ARGV owner, retention ms, channel, pub, all, kind, size, entry id,
--                           units
--   n  renew    KEYS B ...  ARGV owner, lease ms per key
--   t  pttl     KEYS B      ARGV owner
--   z  resize   KEYS B Q W  ARGV size (0: reset), retention ms, channel, pub
--   f  force    KEYS B Q W  ARGV retention ms, channel, pub, kind
--   i  inspect  KEYS B Q W
-- kind is "rw" or "sem"; pub is "s" to announce with SPUBLISH (Redis Cluster), else PUBLISH.
local op = ARGV[1]
local ALL = 1073741824 -- a writer's units
local NEVER = 9000000000000000 -- "=x" of a B with no expiry (a sticky size), in ms

local function fmt(x)
  return string.format('%d', x)
end

-- A holder's field: lease end, units, holds, token, description. Read with string.find, not a
-- pattern: a pattern match costs the server several times more, and this is the hot path.
local function parse(h)
  local a = string.find(h, ' ', 1, true)
  local b = string.find(h, ' ', a + 1, true)
  local c = string.find(h, ' ', b + 1, true)
  local d = string.find(h, ' ', c + 1, true)
  return tonumber(string.sub(h, 1, a - 1)), tonumber(string.sub(h, a + 1, b - 1)),
    tonumber(string.sub(h, b + 1, c - 1)), string.sub(h, c + 1, (d or 0) - 1), d and string.sub(h, d + 1) or ''
end

-- holder makes a holder's field; the token is kept as its decimal string (16 digits: more than
-- tostring keeps), the other numbers are at most 13 digits.
local function holder(d, u, n, t, m)
  return tostring(d) .. ' ' .. tostring(u) .. ' ' .. tostring(n) .. ' ' .. t .. ' ' .. m
end

-- st is B's state for one call: read with load, changed in place, written back by flush.
-- Tokens are kept as decimal strings (ts), compared as numbers (t).
local function load(B, ...)
  local v = redis.call('HMGET', B, '=u', '=t', '=s', '=e', '=x', '=q', '=qx', '=k', ...)
  local st = {u = tonumber(v[1]) or 0, ts = v[2] or nil, s = tonumber(v[3]), e = tonumber(v[4]),
    x = tonumber(v[5]), q = v[6] or nil, qx = tonumber(v[7]), k = v[8] or nil, set = {}, del = {}, dirty = false}
  st.t = st.ts and tonumber(st.ts)
  st.u0, st.e0, st.s0, st.ts0, st.q0, st.qx0 = st.u, st.e, st.s, st.ts, st.q, st.qx
  return st, v[9], v[10]
end

-- hold makes owner a holder until the lease end d.
local function hold(st, owner, d, u, n, t, m)
  st.set[#st.set + 1] = owner
  st.set[#st.set + 1] = holder(d, u, n, t, m)
  if not st.e or d < st.e then
    st.e = d
  end
  st.dirty = true
end

-- flush writes st back: the fields dropped first (HDEL needs no memory: on a server out of
-- memory, a script whose first write it is may write on), then the fields that changed, then
-- the expiry when B must live longer than it would (to need, ms, and half as long again, so
-- that the next calls need no PEXPIRE), or, with exact, exactly until need. A sticky B ("=k")
-- keeps no expiry: its "=x" is NEVER, later than any need.
local function flush(B, st, ms, need, exact)
  if not st.dirty then
    return
  end
  if st.k then
    exact = false
  end
  if #st.del > 0 then
    redis.call('HDEL', B, unpack(st.del))
  end
  local x = st.x
  if exact or not x or x < need then
    x = need
    if not exact then
      x = need + math.floor((need - ms) / 2)
    end
  end
  local kv = st.set
  if st.u ~= st.u0 or not st.x then
    kv[#kv + 1] = '=u'
    kv[#kv + 1] = tostring(st.u)
  end
  if x ~= st.x then
    kv[#kv + 1] = '=x'
    kv[#kv + 1] = fmt(x)
  end
  if st.ts ~= st.ts0 then
    kv[#kv + 1] = '=t'
    kv[#kv + 1] = st.ts
  end
  if st.s and st.s ~= st.s0 then
    kv[#kv + 1] = '=s'
    kv[#kv + 1] = tostring(st.s)
  end
  if st.e and st.e ~= st.e0 then
    kv[#kv + 1] = '=e'
    kv[#kv + 1] = tostring(st.e)
  end
  if st.q and not st.q0 then
    kv[#kv + 1] = '=q'
    kv[#kv + 1] = '1'
  end
  if st.qx and st.qx ~= st.qx0 then
    kv[#kv + 1] = '=qx'
    kv[#kv + 1] = tostring(st.qx)
  end
  if #kv > 0 then
    redis.call('HSET', B, unpack(kv))
  end
  if x ~= st.x then
    redis.call('PEXPIRE', B, x - ms)
  end
end

-- purge drops the holders whose lease ended without a release (crashed, paused, cut off),
-- once "=e" says one may have: it reads every holder and makes "=e" exact again. It returns
-- whether it dropped keep's field (the caller's own lease ended).
local function purge(B, st, ms, keep)
  if not st.e or ms < st.e then
    return false
  end
  local all = redis.call('HGETALL', B)
  local e, gone = nil, false
  for i = 1, #all, 2 do
    local f = all[i]
    if string.byte(f, 1) ~= 61 then -- "=": not a holder
      local d, u = parse(all[i + 1])
      if d and d <= ms then
        st.del[#st.del + 1] = f
        st.u = st.u - u
        gone = gone or f == keep
      elseif d and (not e or d < e) then
        e = d
      end
    end
  end
  st.u = math.max(st.u, 0)
  st.e = e
  if not e then
    st.e0 = nil -- deleted: set again if a holder comes in this call
    st.del[#st.del + 1] = '=e'
  end
  st.dirty = true
  return gone
end

-- token is a new holder's, as a decimal string: a reader's is the last writer's (the last
-- write it may have seen), any other a fresh one, max(last token + 1, server time in µs).
local function token(st, kind, units, now)
  if kind == 'rw' and units < ALL and st.ts then
    return st.ts
  end
  local t = now
  if st.t and st.t + 1 > t then
    t = st.t + 1
  end
  st.t, st.ts = t, fmt(t)
  st.dirty = true
  return st.ts
end

-- walk gives the free units to the queue's live entries in order, and stops at the first that
-- does not fit: a large request is never overtaken by smaller ones behind it (FIFO), and a
-- writer waiting keeps the readers that came after it waiting. Expired entries are dropped on
-- the way. The grants are announced in one message, "G <id> <token> <window ms> ..."; the
-- caller's own entry (id caller) is not announced but taken with the caller's lease, and its
-- token returned. It returns that token or nil, whether it stopped at an entry that does not
-- fit (the queue still holds live entries), and the latest lease end it granted.
-- entry reads a queue entry: expiry, window, owner, units, description (string.find: see parse).
local function entry(e)
  local a = string.find(e, ' ', 1, true)
  local b = string.find(e, ' ', a + 1, true)
  local c = string.find(e, ' ', b + 1, true)
  local d = string.find(e, ' ', c + 1, true)
  return tonumber(string.sub(e, 1, a - 1)), string.sub(e, a + 1, b - 1), string.sub(e, b + 1, c - 1),
    tonumber(string.sub(e, c + 1, (d or 0) - 1)), d and string.sub(e, d + 1) or ''
end

-- "=q" says the queue may hold entries: without it (in a B that exists) the queue is not read.
-- The head is read alone first (when it does not fit, nothing more is read), then 64 at a time.
-- It also returns, when it stopped at an entry, that entry's id and expiry.
local function walk(Q, W, st, kind, size, now, ms, channel, pub, caller, cowner, clease, cmeta)
  if st.x and not st.q then
    return nil, false, ms
  end
  local grants = {}
  local mine, blocked, last, batch = nil, false, ms, 0
  local headID, headExp
  while not blocked do
    local ids = redis.call('ZRANGE', Q, 0, batch)
    if #ids == 0 then
      if st.q then
        st.q, st.q0 = nil, nil -- deleted: set again below if an entry is queued in this call
        st.del[#st.del + 1] = '=q'
        st.dirty = true
      end
      break
    end
    local es
    if #ids == 1 then
      es = {redis.call('HGET', W, ids[1])}
    else
      es = redis.call('HMGET', W, unpack(ids))
    end
    local done = {}
    for i, id in ipairs(ids) do
      local exp, win, owner, units, meta
      if es[i] then
        exp, win, owner, units, meta = entry(es[i])
      end
      if exp and exp > ms and units <= size then -- (a request above a size made smaller waits no more)
        if st.u + units > size then
          blocked, headID, headExp = true, id, exp
          break
        end
        local tok = token(st, kind, units, now)
        st.u = st.u + units
        if id == caller then
          hold(st, cowner, ms + clease, units, 1, tok, cmeta)
          mine = tok
          last = math.max(last, ms + clease)
        else
          hold(st, owner, ms + tonumber(win), units, 1, tok, meta)
          grants[#grants + 1] = id .. ' ' .. tok .. ' ' .. win
          last = math.max(last, ms + tonumber(win))
        end
      end
      done[#done + 1] = id
    end
    if #done > 0 then
      redis.call('ZREM', Q, unpack(done))
      redis.call('HDEL', W, unpack(done))
    end
    if #ids <= batch then
      break
    end
    batch = 63
  end
  if blocked and not st.q then
    st.q = '1'
    st.dirty = true
  end
  if mine or #grants > 0 then
    if kind == 'sem' then
      st.s = size
    end
    st.dirty = true
  end
  if #grants > 0 then
    publish(pub, channel, 'G ' .. table.concat(grants, ' '))
  end
  return mine, blocked, last, headID, headExp
end

-- state lists, for inspection: exists, size, units held, last token, PTTL of B, live queue
-- entries, writers among them, then per live holder: units, holds, token, lease left ms,
-- description.
local function state(B, Q, W, ms)
  local all = redis.call('HGETALL', B)
  local f = {}
  for i = 1, #all, 2 do
    f[all[i]] = all[i + 1]
  end
  local r = {redis.call('EXISTS', B), tonumber(f['=s']) or 0, 0, tonumber(f['=t']) or 0, redis.call('PTTL', B), 0, 0,
    f['=k'] and 1 or 0}
  local ids = redis.call('ZRANGE', Q, 0, -1)
  if #ids > 0 then
    local es = redis.call('HMGET', W, unpack(ids))
    for i = 1, #ids do
      local exp, units
      if es[i] then
        exp, units = string.match(es[i], '^(%d+) %d+ %S+ (%d+)')
      end
      if exp and tonumber(exp) > ms then
        r[6] = r[6] + 1
        if tonumber(units) >= ALL then
          r[7] = r[7] + 1
        end
      end
    end
  end
  for i = 1, #all, 2 do
    if string.byte(all[i], 1) ~= 61 then
      local d, u, n, t, m = parse(all[i + 1])
      if d and d > ms then
        r[3] = r[3] + u
        r[#r + 1] = u
        r[#r + 1] = n
        r[#r + 1] = tonumber(t)
        r[#r + 1] = d - ms
        r[#r + 1] = m
      end
    end
  end
  return r
end

if op == 'a' then
  local B, Q, W = KEYS[1], KEYS[2], KEYS[3]
  local owner, lease, meta, mode = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
  local channel, pub, id, window = ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])
  local kind, units, size, parent = ARGV[10], tonumber(ARGV[11]), tonumber(ARGV[12]), ARGV[13]
  local now, ms = clock()
  local st, h, p = load(B, owner, parent ~= '' and parent or '=u')
  if purge(B, st, ms, owner) then
    h = nil
  end
  if h then
    -- Re-entry (mode r: one more hold), or the claim of a grant the caller has not heard of:
    -- either way the lease restarts.
    local _, u, n, t, m = parse(h)
    if mode == 'r' then
      n = n + 1
    end
    hold(st, owner, ms + lease, u, n, t, m)
    flush(B, st, ms, ms + lease)
    return {1, tonumber(t), n}
  end
  if mode == 'r' then
    flush(B, st, ms, ms + lease)
    return {0, -2, 0}
  end
  if kind == 'rw' then
    size = ALL
  else
    size = st.s or size -- the stored size; the caller's only creates it
    if units > size then
      flush(B, st, ms, ms + lease)
      return {-1, size, 0}
    end
  end
  if mode == 'd' then
    -- A read hold taken under the caller's write hold (a downgrade): it fits whatever is held
    -- or waits, and carries the writer's token.
    local pd, pu, _, pt
    if p and parent ~= '' then
      pd, pu, _, pt = parse(p)
    end
    if not pu or pu < ALL or pd <= ms then
      flush(B, st, ms, ms + lease)
      return {0, -2, 0}
    end
    st.u = st.u + 1
    hold(st, owner, ms + lease, 1, 1, pt, meta)
    flush(B, st, ms, ms + lease)
    return {1, tonumber(pt), 1}
  end
  local caller = ''
  if mode == 'q' then
    caller = id
  end
  local mine, blocked, last, headID, headExp = walk(Q, W, st, kind, size, now, ms, channel, pub, caller, owner, lease, meta)
  if mine then
    flush(B, st, ms, last)
    return {1, tonumber(mine), 1}
  end
  if not blocked and st.u + units <= size then
    local tok = token(st, kind, units, now)
    st.u = st.u + units
    if kind == 'sem' then
      st.s = size
    end
    hold(st, owner, ms + lease, units, 1, tok, meta)
    flush(B, st, ms, math.max(last, ms + lease))
    return {1, tonumber(tok), 1}
  end
  if mode == 'q' then
    local place = tonumber(ARGV[14] or '') or now
    redis.call('ZADD', Q, 'NX', fmt(place), id)
    redis.call('HSET', W, id, fmt(ms + window) .. ' ' .. fmt(window) .. ' ' .. owner .. ' ' .. fmt(units) .. ' ' .. meta)
    -- The queue keys live past every entry: an entry lives a window (at most a second) from its
    -- last refresh, so a second more than this one's covers them all. "=qx" records the latest
    -- such expiry set, so that no PTTL is needed: the keys are set to it (or later), which
    -- never shortens them, and sets it on keys made anew (emptied, then queued into again).
    if not st.qx or st.qx < ms + window then
      st.qx = ms + window + 1000
      st.dirty = true
    end
    redis.call('PEXPIRE', Q, st.qx - ms)
    redis.call('PEXPIRE', W, st.qx - ms)
    if not st.q then
      st.q = '1' -- the queue is read again from now on
      st.dirty = true
    end
    last = math.max(last, ms + window) -- "=q" lives at least as long as the entry
  end
  flush(B, st, ms, last)
  -- When to look again without a notice: when the first holder's lease could end ("=e": a
  -- holder that crashed sends none), and, when the caller would fit but for the entry at the
  -- head of the queue, when that entry expires (its client may have crashed).
  local hint = -1
  if st.e then
    hint = math.max(st.e - ms, 0)
  end
  if st.u + units <= size and headID and headID ~= id then
    local exp = headExp - ms
    if hint < 0 or exp < hint then
      hint = math.max(exp, 0)
    end
  end
  -- The newest token a grant made before this call can carry: the waiter discards such an
  -- announcement (the grant had lapsed, or this call would have claimed it). A reader granted
  -- after the writer that holds now gets that writer's token, so below it.
  local stale = st.t or 0
  if kind == 'rw' and units < ALL and st.u >= ALL and stale > 0 then
    stale = stale - 1
  end
  return {0, hint, st.t or 0, stale}
end

if op == 'r' then
  local B, Q, W = KEYS[1], KEYS[2], KEYS[3]
  local owner, retention, channel, pub = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
  local all, kind, size, leave, units = ARGV[6], ARGV[7], tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
  -- A release only frees memory, so it must work on a server out of memory: its first write
  -- needs none (the HDELs and ZREMs), after which Redis lets the script write on.
  if leave and leave ~= '' then
    redis.call('ZREM', Q, leave)
    redis.call('HDEL', W, leave)
  end
  local r = -1
  if all == '1' and units and redis.call('HDEL', B, owner) == 1 then
    -- The common case, in three calls: the hold goes, its units with it; while others hold and
    -- nobody waits there is nothing more to do (B lives as long as their leases).
    r = 0
    local u = redis.call('HINCRBY', B, '=u', -units)
    if u < 0 then
      redis.call('HSET', B, '=u', '0')
    end
    if u > 0 and not redis.call('HGET', B, '=q') then
      return 0
    end
  end
  local now, ms = clock()
  local st, h = load(B, owner)
  if r == 0 then
    h = nil
  elseif purge(B, st, ms, owner) then
    h = nil
  end
  if h then
    local d, u, n, t, m = parse(h)
    if n > 1 and all ~= '1' then
      if st.x and not st.k then
        redis.call('PEXPIRE', B, math.max(st.x - ms, 1)) -- a first write that needs no memory
      end
      st.set[1], st.set[2] = owner, holder(d, u, n - 1, t, m)
      st.dirty = true
      flush(B, st, ms, d)
      return n - 1
    end
    st.del[#st.del + 1] = owner
    st.u = math.max(st.u - u, 0)
    st.dirty = true
    r = 0
  end
  if kind == 'rw' then
    size = ALL
  else
    size = st.s or size
  end
  local _, _, last = walk(Q, W, st, kind, size, now, ms, channel, pub, '', '', 0, '')
  if st.u == 0 and (r == 0 or st.dirty) then
    -- Free: B keeps the last token (and size) for the retention, exactly.
    st.e, st.e0, st.dirty = nil, nil, true
    st.del[#st.del + 1] = '=e'
    flush(B, st, ms, ms + retention, true)
  else
    flush(B, st, ms, math.max(last, ms + retention))
  end
  return r
end

if op == 'n' then
  local now, ms = clock()
  local r = {}
  for i = 1, #KEYS do
    local B, owner, lease = KEYS[i], ARGV[2 * i], tonumber(ARGV[2 * i + 1])
    local v = redis.call('HMGET', B, owner, '=x')
    local d, u, n, t, m
    if v[1] then
      d, u, n, t, m = parse(v[1])
    end
    if d and d > ms then
      -- PEXPIRE first: on a server out of memory, then the HSET goes through.
      local x = tonumber(v[2]) or 0
      if x < ms + lease then
        x = ms + lease + math.floor(lease / 2)
      end
      redis.call('PEXPIRE', B, x - ms)
      redis.call('HSET', B, owner, holder(ms + lease, u, n, t, m), '=x', fmt(x))
      r[i] = 1
    else
      r[i] = 0
    end
  end
  return r
end

if op == 't' then
  local now, ms = clock()
  local h = redis.call('HGET', KEYS[1], ARGV[2])
  local d = h and parse(h)
  if d and d > ms then
    return d - ms
  end
  return -2
end

-- resize sets the size and makes it sticky: B loses its expiry, so the size outlives every
-- holder until the next resize; growing it grants the queue what now fits, shrinking it takes
-- nothing from the holders (the walk grants nothing until what they hold fits). A reset (size
-- 0) makes a sticky size ordinary: B expires again once the last lease and queue entry and the
-- retention are past, and, when nobody holds or waits, the size goes at once. Reply: the former
-- size (0: none), units held, holders, whether it was sticky (1 or 0), the size now (0: none),
-- whether it is sticky now.
if op == 'z' then
  local B, Q, W = KEYS[1], KEYS[2], KEYS[3]
  local size, retention, channel, pub = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
  local now, ms = clock()
  local st = load(B)
  purge(B, st, ms, '')
  local old, was = st.s or 0, st.k and 1 or 0
  if size > 0 then
    st.s = size
    st.dirty = true
    local _, _, last = walk(Q, W, st, 'sem', size, now, ms, channel, pub, '', '', 0, '')
    local persist = not st.k
    if persist then
      st.k, st.x = '1', NEVER
      st.set[#st.set + 1] = '=k'
      st.set[#st.set + 1] = '1'
      st.set[#st.set + 1] = '=x'
      st.set[#st.set + 1] = fmt(NEVER)
      st.set[#st.set + 1] = '=u' -- (flush writes it only when it changed or B is new)
      st.set[#st.set + 1] = tostring(st.u)
    end
    flush(B, st, ms, last)
    if persist then
      -- B loses its expiry: it is made anew, emptied (which deletes it) and written again, with
      -- only HDEL and HSET (the minimal ACL rule has no PERSIST), in bounded batches.
      local all = redis.call('HGETALL', B)
      for i = 1, #all, 1000 do
        local fs = {}
        for j = i, math.min(i + 999, #all), 2 do
          fs[#fs + 1] = all[j]
        end
        redis.call('HDEL', B, unpack(fs))
      end
      for i = 1, #all, 1000 do
        redis.call('HSET', B, unpack(all, i, math.min(i + 999, #all)))
      end
    end
  elseif st.k then
    local all = redis.call('HGETALL', B)
    local holders, need = 0, ms + retention
    for i = 1, #all, 2 do
      if string.byte(all[i], 1) ~= 61 then
        local d = parse(all[i + 1])
        if d and d > ms then
          holders = holders + 1
          need = math.max(need, d)
        end
      end
    end
    if st.q and st.qx then
      need = math.max(need, st.qx)
    end
    st.del[#st.del + 1] = '=k'
    if holders == 0 and not st.q then
      st.del[#st.del + 1] = '=s'
      st.s, st.s0 = nil, nil
    end
    st.k, st.x, st.dirty = nil, nil, true
    flush(B, st, ms, need, true)
  end
  local holders, all = 0, redis.call('HGETALL', B)
  for i = 1, #all, 2 do
    if string.byte(all[i], 1) ~= 61 then
      holders = holders + 1
    end
  end
  return {old, st.u, holders, was, st.s or 0, st.k and 1 or 0}
end

if op == 'f' then
  local B, Q, W = KEYS[1], KEYS[2], KEYS[3]
  local retention, channel, pub, kind = tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
  local now, ms = clock()
  local r = state(B, Q, W, ms)
  local st = load(B)
  local all = redis.call('HGETALL', B)
  local dropped = 0
  for i = 1, #all, 2 do
    if string.byte(all[i], 1) ~= 61 then
      st.del[#st.del + 1] = all[i]
      dropped = dropped + 1
    end
  end
  if dropped > 0 then
    st.u, st.e, st.e0, st.dirty = 0, nil, nil, true
    st.del[#st.del + 1] = '=e'
    local size = ALL
    if kind == 'sem' then
      size = st.s or 0
    end
    local _, _, last = walk(Q, W, st, kind, size, now, ms, channel, pub, '', '', 0, '')
    if st.u == 0 then
      flush(B, st, ms, ms + retention, true)
    else
      flush(B, st, ms, math.max(last, ms + retention))
    end
  end
  r[#r + 1] = dropped
  return r
end

if op == 'i' then
  local now, ms = clock()
  return state(KEYS[1], KEYS[2], KEYS[3], ms)
end

return redis.error_reply('ERR dlock shared.lua: unknown operation')
