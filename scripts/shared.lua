-- shared: the read-write lock and the semaphore. Every operation on them is in this one script
-- so that the grant walk, which most of them end with, exists once (docs/PROTOCOL.md,
-- "Read-write locks and semaphores").
--
-- One read-write lock or semaphore has four keys, all with its name as the Cluster hash tag:
--   B  <prefix>{<tag>}:rw or :sem  hash: "=t" the last token, "=u" the units held, "=s" the
--                                  size (semaphore), and per holder
--                                  <owner> -> "<units> <holds> <token> <description>"
--   E  B:e  sorted set: holder's owner -> the end of its lease (ms, server clock)
--   Q  B:q  sorted set: waiting entry id -> its place (µs, server clock, at registration)
--   W  B:w  hash: entry id -> "<expiry ms> <window ms> <owner> <units> <description>"
-- A read-write lock counts as a semaphore of ALL units: a reader takes one, a writer takes
-- ALL, so a writer fits only when nobody holds it and a reader only while no writer does.
-- Every holder has its own lease in E: one that is not renewed leaves alone (purge), the
-- others keep theirs. B and E expire together, never before the longest lease, and B keeps
-- the last token for the retention after a release.
--
-- ARGV[1] is the operation:
--   a  acquire  KEYS B E Q W  ARGV owner, lease ms, description, mode, channel, pub, entry id,
--                             window ms, kind, units, size, parent owner, place
--   r  release  KEYS B E Q W  ARGV owner, retention ms, channel, pub, all, kind, size, entry id
--   n  renew    KEYS B E ...  ARGV owner, lease ms per pair of keys
--   t  pttl     KEYS B E      ARGV owner
--   z  resize   KEYS B E Q W  ARGV size, retention ms, channel, pub
--   f  force    KEYS B E Q W  ARGV retention ms, channel, pub, kind
--   i  inspect  KEYS B E Q W
-- kind is "rw" or "sem"; pub is "s" to announce with SPUBLISH (Redis Cluster), else PUBLISH.
local op = ARGV[1]
local ALL = 1073741824 -- a writer's units

local function fmt(x)
  return string.format('%d', x)
end

local function clock()
  local now = redis.call('TIME')
  return now, tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- keep makes B and E live at least ms more, and exactly as long as each other. PEXPIRE needs
-- no memory: on a server out of memory, a script whose first write it is may write on.
local function keep(B, E, ms)
  local t = math.max(ms, redis.call('PTTL', B), redis.call('PTTL', E))
  if t > 0 then
    redis.call('PEXPIRE', B, t)
    redis.call('PEXPIRE', E, t)
  end
end

local function publish(channel, pub, payload)
  local cmd = 'PUBLISH'
  if pub == 's' then
    cmd = 'S' .. cmd -- built at run time, as in release.lua
  end
  return redis.call(cmd, channel, payload)
end

-- settle sets the expiry of B and E after holders left: the longest lease left, and at least
-- the retention (B keeps the last token, and a semaphore's size, that long).
local function settle(B, E, ms, retention)
  local last = redis.call('ZRANGE', E, -1, -1, 'WITHSCORES')
  local t = retention
  if last[2] then
    t = math.max(t, tonumber(last[2]) - ms)
  end
  redis.call('PEXPIRE', B, t)
  redis.call('PEXPIRE', E, t)
end

-- purge drops the holders whose lease ended without a release (crashed, paused, cut off).
local function purge(B, E, ms)
  local gone = redis.call('ZRANGE', E, '-inf', fmt(ms), 'BYSCORE')
  if #gone == 0 then
    return
  end
  local used = tonumber(redis.call('HGET', B, '=u')) or 0
  for _, o in ipairs(gone) do
    redis.call('ZREM', E, o)
    local h = redis.call('HGET', B, o)
    if h then
      redis.call('HDEL', B, o)
      used = used - tonumber(string.match(h, '^%d+'))
    end
  end
  redis.call('HSET', B, '=u', fmt(math.max(used, 0)))
end

-- fresh makes a new token: max(last token + 1, server time in µs).
local function fresh(B, now)
  local t = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('HGET', B, '=t'))
  if last and last + 1 > t then
    t = last + 1
  end
  redis.call('HSET', B, '=t', fmt(t))
  return t
end

-- token is a new holder's: a reader's is the last writer's (the last write it may have seen),
-- any other a fresh one.
local function token(B, kind, units, now)
  if kind == 'rw' and units < ALL then
    local t = tonumber(redis.call('HGET', B, '=t'))
    if t then
      return t
    end
  end
  return fresh(B, now)
end

local function hold(B, E, owner, units, tok, meta, lease, ms)
  redis.call('HSET', B, owner, fmt(units) .. ' 1 ' .. fmt(tok) .. ' ' .. meta)
  redis.call('ZADD', E, fmt(ms + lease), owner)
  keep(B, E, lease)
end

-- walk gives the free units to the queue's live entries in order, and stops at the first that
-- does not fit: a large request is never overtaken by smaller ones behind it (FIFO), and a
-- writer waiting keeps the readers that came after it waiting. Expired entries are dropped on
-- the way. The grants are announced in one message, "G <id> <token> <window ms> ..."; the
-- caller's own entry (id caller) is not announced but taken with the caller's lease, and its
-- token returned. Returns the units held afterwards, and that token or nil.
local function walk(B, E, Q, W, kind, size, now, ms, channel, pub, caller, cowner, clease, cmeta)
  local used = tonumber(redis.call('HGET', B, '=u')) or 0
  local grants = {}
  local mine
  while true do
    local id = redis.call('ZRANGE', Q, 0, 0)[1]
    if not id then
      break
    end
    local e = redis.call('HGET', W, id)
    local exp, win, owner, units, meta
    if e then
      exp, win, owner, units, meta = string.match(e, '^(%d+) (%d+) (%S+) (%d+) (.*)$')
    end
    if exp and tonumber(exp) > ms then
      units = tonumber(units)
      if used + units > size then
        break
      end
      local tok = token(B, kind, units, now)
      used = used + units
      if id == caller then
        hold(B, E, cowner, units, tok, cmeta, clease, ms)
        mine = tok
      else
        hold(B, E, owner, units, tok, meta, tonumber(win), ms)
        grants[#grants + 1] = id .. ' ' .. fmt(tok) .. ' ' .. win
      end
    end
    redis.call('ZREM', Q, id)
    redis.call('HDEL', W, id)
  end
  if mine or #grants > 0 then
    redis.call('HSET', B, '=u', fmt(used))
    if kind == 'sem' then
      redis.call('HSET', B, '=s', fmt(size))
    end
  end
  if #grants > 0 then
    publish(channel, pub, 'G ' .. table.concat(grants, ' '))
  end
  return used, mine
end

-- state lists, for inspection: exists, size, units held, last token, PTTL of B, live queue
-- entries, writers among them, then per live holder: units, holds, token, lease left ms,
-- description.
local function state(B, E, Q, W, ms)
  local r = {redis.call('EXISTS', B), tonumber(redis.call('HGET', B, '=s')) or 0, 0,
    tonumber(redis.call('HGET', B, '=t')) or 0, redis.call('PTTL', B), 0, 0}
  for _, id in ipairs(redis.call('ZRANGE', Q, 0, -1)) do
    local e = redis.call('HGET', W, id)
    local exp, units
    if e then
      exp, units = string.match(e, '^(%d+) %d+ %S+ (%d+)')
    end
    if exp and tonumber(exp) > ms then
      r[6] = r[6] + 1
      if tonumber(units) >= ALL then
        r[7] = r[7] + 1
      end
    end
  end
  local hs = redis.call('ZRANGE', E, 0, -1, 'WITHSCORES')
  for i = 1, #hs, 2 do
    local h = redis.call('HGET', B, hs[i])
    local left = tonumber(hs[i + 1]) - ms
    if h and left > 0 then
      local units, holds, tok, meta = string.match(h, '^(%d+) (%d+) (%d+) ?(.*)$')
      r[3] = r[3] + tonumber(units)
      r[#r + 1] = tonumber(units)
      r[#r + 1] = tonumber(holds)
      r[#r + 1] = tonumber(tok)
      r[#r + 1] = left
      r[#r + 1] = meta
    end
  end
  return r
end

if op == 'a' then
  local B, E, Q, W = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local owner, lease, meta, mode = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
  local channel, pub, id, window = ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])
  local kind, units, size, parent = ARGV[10], tonumber(ARGV[11]), tonumber(ARGV[12]), ARGV[13]
  local now, ms = clock()
  purge(B, E, ms)
  local h = redis.call('HGET', B, owner)
  if h then
    -- Re-entry (mode r: one more hold), or the claim of a grant the caller has not heard of:
    -- either way the lease restarts.
    local u, n, t, m = string.match(h, '^(%d+) (%d+) (%d+) (.*)$')
    n = tonumber(n)
    if mode == 'r' then
      n = n + 1
      redis.call('HSET', B, owner, u .. ' ' .. n .. ' ' .. t .. ' ' .. m)
    end
    redis.call('ZADD', E, fmt(ms + lease), owner)
    keep(B, E, lease)
    return {1, tonumber(t), n}
  end
  if mode == 'r' then
    return {0, -2, 0}
  end
  if kind == 'rw' then
    size = ALL
  else
    local stored = tonumber(redis.call('HGET', B, '=s'))
    if stored and stored ~= size then
      return {-1, stored, 0}
    end
  end
  if mode == 'd' then
    -- A read hold taken under the caller's write hold (a downgrade): it fits whatever is held
    -- or waits, and carries the writer's token.
    local p = redis.call('HGET', B, parent)
    local pu, pt
    if p then
      pu, pt = string.match(p, '^(%d+) %d+ (%d+)')
    end
    if not pu or tonumber(pu) < ALL then
      return {0, -2, 0}
    end
    redis.call('HSET', B, '=u', fmt((tonumber(redis.call('HGET', B, '=u')) or 0) + 1))
    hold(B, E, owner, 1, tonumber(pt), meta, lease, ms)
    return {1, tonumber(pt), 1}
  end
  local caller = ''
  if mode == 'q' then
    caller = id
  end
  local used, mine = walk(B, E, Q, W, kind, size, now, ms, channel, pub, caller, owner, lease, meta)
  if mine then
    return {1, mine, 1}
  end
  if redis.call('ZCARD', Q) == 0 and used + units <= size then
    local tok = token(B, kind, units, now)
    redis.call('HSET', B, '=u', fmt(used + units))
    if kind == 'sem' then
      redis.call('HSET', B, '=s', fmt(size))
    end
    hold(B, E, owner, units, tok, meta, lease, ms)
    return {1, tok, 1}
  end
  if mode == 'q' then
    local place = tonumber(ARGV[14] or '') or tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('ZADD', Q, 'NX', fmt(place), id)
    redis.call('HSET', W, id, fmt(ms + window) .. ' ' .. fmt(window) .. ' ' .. owner .. ' ' .. fmt(units) .. ' ' .. meta)
    local k = math.max(window, redis.call('PTTL', Q))
    redis.call('PEXPIRE', Q, k)
    redis.call('PEXPIRE', W, k)
  end
  -- When to look again without a notice: when the first holder's lease ends (a holder that
  -- crashed sends none), and, when the caller would fit but for the entry at the head of the
  -- queue, when that entry expires (its client may have crashed).
  local hint = -1
  local first = redis.call('ZRANGE', E, 0, 0, 'WITHSCORES')
  if first[2] then
    hint = tonumber(first[2]) - ms
  end
  if used + units <= size then
    local head = redis.call('ZRANGE', Q, 0, 0)[1]
    local e = head and head ~= id and redis.call('HGET', W, head)
    if e then
      local exp = tonumber(string.match(e, '^%d+')) - ms
      if hint < 0 or exp < hint then
        hint = exp
      end
    end
  end
  keep(B, E, lease)
  return {0, hint, tonumber(redis.call('HGET', B, '=t')) or 0}
end

if op == 'r' then
  local B, E, Q, W = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local owner, retention, channel, pub = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
  local all, kind, size, leave = ARGV[6], ARGV[7], tonumber(ARGV[8]), ARGV[9]
  local now, ms = clock()
  -- A release only frees memory, so it must work on a server out of memory: its first write
  -- needs none (keep, or the HDELs and ZREMs below), after which Redis lets the script write on.
  keep(B, E, 0)
  if leave and leave ~= '' then
    redis.call('ZREM', Q, leave)
    redis.call('HDEL', W, leave)
  end
  purge(B, E, ms)
  local r = -1
  local h = redis.call('HGET', B, owner)
  if h then
    local u, n, t, m = string.match(h, '^(%d+) (%d+) (%d+) (.*)$')
    n = tonumber(n)
    if n > 1 and all ~= '1' then
      redis.call('HSET', B, owner, u .. ' ' .. (n - 1) .. ' ' .. t .. ' ' .. m)
      return n - 1
    end
    redis.call('HDEL', B, owner)
    redis.call('ZREM', E, owner)
    local used = (tonumber(redis.call('HGET', B, '=u')) or 0) - tonumber(u)
    redis.call('HSET', B, '=u', fmt(math.max(used, 0)))
    r = 0
  end
  if kind == 'rw' then
    size = ALL
  else
    size = tonumber(redis.call('HGET', B, '=s')) or size
  end
  walk(B, E, Q, W, kind, size, now, ms, channel, pub, '', '', 0, '')
  settle(B, E, ms, retention)
  return r
end

if op == 'n' then
  local now, ms = clock()
  local r = {}
  for i = 1, #KEYS / 2 do
    local B, E = KEYS[2 * i - 1], KEYS[2 * i]
    local owner, lease = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
    local d = redis.call('ZSCORE', E, owner)
    if d and tonumber(d) > ms then
      keep(B, E, lease) -- first: on a server out of memory, then the ZADD goes through
      redis.call('ZADD', E, 'XX', fmt(ms + lease), owner)
      r[i] = 1
    else
      r[i] = 0
    end
  end
  return r
end

if op == 't' then
  local now, ms = clock()
  local d = redis.call('ZSCORE', KEYS[2], ARGV[2])
  if d and tonumber(d) > ms then
    return tonumber(d) - ms
  end
  return -2
end

if op == 'z' then
  local B, E, Q, W = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local size, retention, channel, pub = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
  local now, ms = clock()
  purge(B, E, ms)
  local old = tonumber(redis.call('HGET', B, '=s')) or 0
  redis.call('HSET', B, '=s', fmt(size))
  walk(B, E, Q, W, 'sem', size, now, ms, channel, pub, '', '', 0, '')
  keep(B, E, retention)
  return old
end

if op == 'f' then
  local B, E, Q, W = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local retention, channel, pub, kind = tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
  local now, ms = clock()
  local r = state(B, E, Q, W, ms)
  keep(B, E, 0)
  local holders = redis.call('ZRANGE', E, 0, -1)
  for _, o in ipairs(holders) do
    redis.call('ZREM', E, o)
    redis.call('HDEL', B, o)
  end
  local size = ALL
  if kind == 'sem' then
    size = tonumber(redis.call('HGET', B, '=s')) or 0
  end
  if #holders > 0 then
    redis.call('HSET', B, '=u', '0')
    walk(B, E, Q, W, kind, size, now, ms, channel, pub, '', '', 0, '')
    settle(B, E, ms, retention)
  end
  r[#r + 1] = #holders
  return r
end

if op == 'i' then
  local now, ms = clock()
  return state(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ms)
end

return redis.error_reply('ERR dlock shared.lua: unknown operation')
