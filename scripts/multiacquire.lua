-- uses: publish, grantNotice
-- multiacquire: take several locks of one server (one Cluster slot) all at once, or none of
-- them; or, in ordered mode, the free ones before the first busy one. Each lock is the same
-- key, value, queue and token as a single lock's (acquire.lua): a plain lock of one of the
-- names and this script exclude each other.
-- KEYS     triples, one per lock in the caller's global order: the lock key, its queue
--          <key>:q and its queue entries <key>:w (see acquire.lua)
-- ARGV[1]  owner secret of the caller for the locks it takes (no spaces)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  holder description
-- ARGV[4]  "a": all or none; "p": the locks before the first busy one (all when none is busy)
-- ARGV[5]  "s" to announce with SPUBLISH (Redis Cluster), else PUBLISH
-- ARGV[6]  the caller's queue entry id ("<client id>.<n>"), or "" (no queueing): entries of the
--          caller's client do not stand before it
-- ARGV[7]  where to queue the caller when a lock is busy: "" nowhere; "*" at the first busy
--          lock; "<i>" at lock i only if it is the first busy one
-- ARGV[8]  the entry's owner secret: the holder a grant to the entry installs, and the owner
--          of lock i when ARGV[7] is "<i>" and the caller takes it (a lock granted to the
--          entry is claimed: its lease restarts)
-- ARGV[9]  the entry's acceptance window in ms (with ARGV[7] not "")
-- Reply    {busy, pttl, token, t1, ..., tn}
--          busy  0 when every lock was taken; else the index of the first busy lock in KEYS
--                order (held by another owner, or granted just now to the first client in its
--                queue)
--          pttl  that lock's remaining lease in ms (a grant's window), token its holder's token
--          ti    the token of lock i when this call took or claimed it, else 0
-- Locks after the first busy one are not looked at. A free lock whose queue holds a live entry
-- of another client first is granted to that entry, and announced, as acquire.lua does (to the
-- entry's client's channel <key>:rel:<client id>, to the channel of the client queued next,
-- and on the release channel <key>:rel when anyone may listen there: a subscriber of it, or,
-- not on a Cluster, of any pattern), and counts as busy.
-- New tokens follow acquire.lua's rule: max(last token + 16, server time in microseconds).
local n = #KEYS / 3
local now = redis.call('TIME')
local nowms = now[1] * 1000 + math.floor(now[2] / 1000)
local nowus = now[1] * 1000000 + now[2]
local mine = string.match(ARGV[6], '^[^.]*%.')
local at = 0 -- queue nowhere
if ARGV[7] == '*' then
  at = -1
elseif ARGV[7] ~= '' then
  at = tonumber(ARGV[7])
end
local eo = ARGV[8]

-- grant announces a grant of lock k (queue q) to entry id, as acquire.lua does.
local function grant(k, q, id, msg)
  local rel = k .. ':rel'
  grantNotice(ARGV[5], q, rel, id, msg)
  local listened
  if ARGV[5] == 's' then
    listened = redis.call('PUBSUB', 'SHARDNUMSUB', rel)[2] > 0
  else
    listened = redis.call('PUBSUB', 'NUMSUB', rel)[2] > 0 or redis.call('PUBSUB', 'NUMPAT') > 0
  end
  if listened then
    publish(ARGV[5], rel, msg)
  end
end
-- first returns the first live entry of a queue, dropping the expired ones before it.
local function first(q, w)
  while true do
    local id = redis.call('ZRANGE', q, 0, 0)[1]
    if not id then
      return nil
    end
    local e = redis.call('HGET', w, id)
    if e and tonumber(string.sub(e, 1, string.find(e, ' ', 1, true) - 1)) > nowms then
      return id, e
    end
    redis.call('ZREM', q, id)
    redis.call('HDEL', w, id)
  end
end

local tok, claim, clear = {}, {}, {}
local busy, pttl, btok = 0, 0, 0
for i = 1, n do
  local k, q, w = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local v = redis.call('GET', k)
  local last
  if v then
    if at == i and string.byte(v, #eo + 1) == 32 and string.find(v, eo, 1, true) == 1 then
      claim[i] = tonumber(string.match(v, '^%S+ (%d+) '))
    elseif string.byte(v, 1) == 45 and string.byte(v, 2) == 32 then
      last = tonumber(string.sub(v, 3, -3)) -- released: "- <token> 0"
    else
      -- held by another owner (or not a lock value): its remaining lease and its token
      local t = 0
      local s1 = string.find(v, ' ', 1, true)
      if s1 then
        local s2 = string.find(v, ' ', s1 + 1, true)
        t = tonumber(string.sub(v, s1 + 1, (s2 or 0) - 1)) or 0
      end
      busy, pttl, btok = i, redis.call('PTTL', k), t
      break
    end
  end
  if not claim[i] then
    local t = nowus
    if last and last + 16 > t then
      t = last + 16
    end
    if redis.call('EXISTS', q) == 1 then
      local id, e = first(q, w)
      if id and mine and string.sub(id, 1, #mine) == mine then
        clear[i] = true -- the caller's client's own entries leave when it takes the lock
        id = nil
      end
      if id then
        -- A client queued before the caller: the lock is its until its entry would have lapsed
        -- (at most its acceptance window).
        local exp, owner, meta = string.match(e, '^(%d+) %d+ (%S+) (.*)$')
        local win = string.format('%d', math.max(tonumber(exp) - nowms, 1))
        redis.call('ZREM', q, id)
        redis.call('HDEL', w, id)
        redis.call('SET', k, owner .. ' ' .. string.format('%d', t) .. ' 1 ' .. meta, 'PX', win)
        grant(k, q, id, 'g ' .. string.format('%d', t) .. ' ' .. id .. ' ' .. win)
        busy, pttl, btok = i, tonumber(win), t
        break
      end
    end
    tok[i] = t
  end
end

if busy > 0 and (at == -1 or at == busy) then
  -- Queue the caller's entry at the busy lock (or refresh it, keeping its place).
  local q, w = KEYS[3 * busy - 1], KEYS[3 * busy]
  local win = tonumber(ARGV[9])
  redis.call('ZADD', q, 'NX', nowus, ARGV[6])
  redis.call('HSET', w, ARGV[6], string.format('%d', nowms + win) .. ' ' .. ARGV[9] .. ' ' .. eo .. ' ' .. ARGV[3])
  local keep = math.max(win, redis.call('PTTL', q))
  redis.call('PEXPIRE', q, keep)
  redis.call('PEXPIRE', w, keep)
end

local upto = n
if busy > 0 then
  upto = 0
  if ARGV[4] == 'p' then
    upto = busy - 1
  end
end
local r = {busy, pttl, btok}
for i = 1, n do
  r[3 + i] = 0
end
for i = 1, upto do
  local k = KEYS[3 * i - 2]
  if claim[i] then
    redis.call('PEXPIRE', k, ARGV[2])
    r[3 + i] = claim[i]
  else
    local o = ARGV[1]
    if at == i then
      o = eo
    end
    redis.call('SET', k, o .. ' ' .. string.format('%d', tok[i]) .. ' 1 ' .. ARGV[3], 'PX', ARGV[2])
    r[3 + i] = tok[i]
    if clear[i] then
      local q, w = KEYS[3 * i - 1], KEYS[3 * i]
      for _, other in ipairs(redis.call('ZRANGE', q, 0, -1)) do
        if string.sub(other, 1, #mine) == mine then
          redis.call('ZREM', q, other)
          redis.call('HDEL', w, other)
        end
      end
    end
  end
end
return r
