-- The script library: helpers that several scripts need, each written once here. A script asks
-- for the ones it uses on its first line, as "-- uses: publish, clientChannel"; the library
-- (scripts.go, assemble) puts those blocks, in this file's order, before the script's own text,
-- or where the script marks: a line "-- (library: a, b)" gets blocks a and b (and what they
-- need that is not placed yet), a line "-- (library)" every other block asked for. The script's
-- SHA is that of the assembled source (dlock.Scripts() gives it). A local function costs a
-- closure on every call, so only what a script asks for is built, and a path that returns
-- before a mark builds none of what is placed there (acquire.lua and release.lua open with a
-- fast path that needs no block at all).
-- Each block starts at a line "--- <name>"; "(needs: a, b)" after the name pulls those in too,
-- and those come earlier in this file. Blocks keep per-call state in their own locals (the
-- time, whether any queue of the call exists, who listens): one reading per call.

--- publish
-- publish announces payload on channel: with SPUBLISH when pub is "s" (sharded pub/sub on a
-- Cluster), else PUBLISH. It returns how many clients received it.
local function publish(pub, channel, payload)
  local cmd = 'PUBLISH'
  if pub == 's' then
    cmd = 'S' .. cmd -- built at run time: some embedded test servers refuse unknown names at compile time
  end
  return redis.call(cmd, channel, payload)
end

--- clientChannel
-- clientChannel is the channel of the client whose queue entry is id ("<client id>.<n>"), for
-- the lock whose release channel is rel: "<rel>:<client id>".
local function clientChannel(rel, id)
  return rel .. ':' .. (string.match(id, '^([^.]*)%.') or id)
end

--- clock
-- clock reads the server's time once per call, when first needed: now (µs) and nowms (ms),
-- which it returns; every later call of the script reads the same time. nowtext is now in
-- decimal, as a token is written, once nextToken has made it.
local now, nowms, nowtext
local function clock()
  if not now then
    local t = redis.call('TIME')
    local s, us = tonumber(t[1]), tonumber(t[2])
    now, nowms = s * 1000000 + us, s * 1000 + math.floor(us / 1000)
  end
  return now, nowms
end

--- nextToken (needs: clock)
-- nextToken returns a new token, and it in decimal, for a lock whose last token was last (nil:
-- none known): max(last + 16, the server's time in µs). The 15 tokens after a holder's are for
-- the holders its client passes the lock to without the server (handover.lua's local handoffs).
local function nextToken(last)
  clock()
  if last and last + 16 > now then
    return last + 16, string.format('%d', last + 16)
  end
  nowtext = nowtext or string.format('%d', now)
  return now, nowtext
end

--- suffixed
-- suffixed returns the key of every lock of a batch (KEYS) with suffix: its queue, its channel.
local function suffixed(suffix)
  local out = {}
  for i, key in ipairs(KEYS) do
    out[i] = key .. suffix
  end
  return out
end

--- queued (needs: suffixed)
-- For a script with a one-lock and a batch form (acquire.lua, release.lua): batch is whether
-- the call is a batch (ARGV[1] is "", never an owner), queues the queue of every lock of the
-- call (KEYS[2]; in a batch <key>:q of each of KEYS, the lock keys). queued reports whether the
-- queue q of a lock of the call may exist: false only when it surely does not. In a batch, the
-- first call asks EXISTS of all the queues at once; while none exists (noqueue: a script that
-- queues sets it false), none is asked again. For one lock it asks nothing: reading the queue
-- costs what asking would.
local batch = ARGV[1] == ''
local queues = {KEYS[2]}
if batch then
  queues = suffixed(':q')
end
local noqueue
local function queued(q)
  if not batch then
    return true -- one lock: its queue is read at once (grantFirst's ZRANGE of no key is empty)
  end
  if noqueue == nil then
    local n = redis.call('EXISTS', unpack(queues))
    noqueue = n == 0
    if n == #queues then
      return true
    end
  end
  if noqueue then
    return false
  end
  return redis.call('EXISTS', q) == 1
end

--- announce (needs: publish, suffixed)
-- announce sends payload on the release channel rel of a lock of the call when anyone may
-- listen there: on a Cluster (pub "s") a subscriber of it (sharded), else a subscriber of any
-- pattern or of it. PUBSUB NUMPAT is asked once per call, and PUBSUB NUMSUB once, of rel or,
-- with many (a batch), of every lock's release channel (<key>:rel of each of KEYS): waiting
-- clients do not listen there, so a busy lock costs no message per waiting client.
local patterns, listeners
local function announce(pub, rel, payload, many)
  if pub == 's' then
    if redis.call('PUBSUB', 'SHARDNUMSUB', rel)[2] > 0 then
      publish(pub, rel, payload)
    end
    return
  end
  if patterns == nil then
    patterns = redis.call('PUBSUB', 'NUMPAT') > 0
  end
  if not patterns and not listeners then
    local chans = {rel}
    if many then
      chans = suffixed(':rel')
    end
    listeners = {}
    local r = redis.call('PUBSUB', 'NUMSUB', unpack(chans))
    for i = 1, #r, 2 do
      listeners[r[i]] = r[i + 1]
    end
  end
  if patterns or (listeners[rel] or 1) > 0 then
    publish(pub, rel, payload)
  end
end

--- set
-- set is SET key ... that works on a server out of memory (maxmemory under noeviction), for
-- the writes of a release: Redis refuses a script's first write that may need memory, not one
-- that cannot (PEXPIRE), and lets a script that has written go on. So a SET refused for memory
-- is made again after a PEXPIRE of key to pexpire ms (nil: to its remaining time). Once a write
-- of the call succeeded, none is refused any more: plain calls then.
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

--- ownedToken
-- ownedToken reads the lock value v ("<owner> <token> <holds> <description>") of owner o: its
-- token (in decimal, as stored) and where the space after it is. It returns false when v is not
-- o's value (or there is none), nil when it is but has nothing after the token.
local function ownedToken(v, o)
  if not v or string.byte(v, #o + 1) ~= 32 or string.find(v, o, 1, true) ~= 1 then
    return false
  end
  local s2 = string.find(v, ' ', #o + 2, true)
  if s2 then
    return string.sub(v, #o + 2, s2 - 1), s2
  end
end

--- batched
-- batched does the locks of a batch call (acquire.lua, release.lua): from ARGV[g] on come
-- groups, each of head arguments, the number n of its locks, then n records of per arguments.
-- For lock i (the i-th of KEYS, in that order) it calls one(i, g, p), g the index of its group's
-- first argument and p that of its record, under pcall, and puts its result in the reply: the
-- first one, or with wide all four (a missing fourth as 0); when it raised an error, fail (and
-- three zeros): the other locks are done all the same.
local function batched(g, head, per, wide, fail, one)
  local out, i = {}, 0
  while g <= #ARGV do
    local n = tonumber(ARGV[g + head])
    for p = g + head + 1, g + head + per * n, per do
      i = i + 1
      local ok, a, b, c, d = pcall(one, i, g, p)
      if not ok then
        a, b, c, d = fail, 0, 0, 0
      end
      local o = #out
      out[o + 1] = a
      if wide then
        out[o + 2], out[o + 3], out[o + 4] = b, c, d or 0
      end
    end
    g = g + head + 1 + per * n
  end
  return out
end

--- leave
-- leave drops queue entry id (when not nil or empty) from queue q and entries w.
local function leave(q, w, id)
  if id and id ~= '' then
    redis.call('ZREM', q, id)
    redis.call('HDEL', w, id)
  end
end

--- released
-- released reports whether v is a released lock's value, "- <token> 0", and its token (nil
-- when that is not a number).
local function released(v)
  if string.byte(v, 1) == 45 and string.byte(v, 2) == 32 then
    return true, tonumber(string.sub(v, 3, -3))
  end
  return false
end

--- holderToken
-- holderToken is the token of the lock value v, "<owner> <token> ...", or 0 when it has none
-- (not a lock value). Read with string.find/sub: a pattern costs the server more.
local function holderToken(v)
  local s1 = string.find(v, ' ', 1, true)
  if s1 then
    local s2 = string.find(v, ' ', s1 + 1, true)
    return tonumber(string.sub(v, s1 + 1, (s2 or 0) - 1)) or 0
  end
  return 0
end

--- keepQueue
-- keepQueue makes queue q and its entries w live at least win ms (a number) from now: an entry
-- made or refreshed now lives that long. No window is longer than a second (the client's
-- acceptWindow), so both keys are set to live a second (or win, if ever longer) without asking
-- how long they had left: they outlive their last entry by less than a second, and what reads
-- them checks each entry's own expiry.
local function keepQueue(q, w, win)
  local keep = math.max(win, 1000)
  redis.call('PEXPIRE', q, keep)
  redis.call('PEXPIRE', w, keep)
end

--- enqueue (needs: clock, keepQueue)
-- enqueue queues (or refreshes, keeping its place) entry id of owner in queue q and entries w,
-- now, for the window win (ms, in decimal), with description meta, at place (nil or "": the
-- server's time in µs).
local function enqueue(q, w, id, owner, meta, win, place)
  clock()
  local n = tonumber(win)
  redis.call('ZADD', q, 'NX', tonumber(place or '') or now, id)
  redis.call('HSET', w, id, string.format('%d', nowms + n) .. ' ' .. win .. ' ' .. owner .. ' ' .. meta)
  keepQueue(q, w, n)
end

--- dropClient
-- dropClient drops from queue q (entries w) every entry of the client whose entry ids start
-- with mine ("<client id>."): a client that takes the lock no longer waits for it.
local function dropClient(q, w, mine)
  for _, other in ipairs(redis.call('ZRANGE', q, 0, -1)) do
    if string.sub(other, 1, #mine) == mine then
      redis.call('ZREM', q, other)
      redis.call('HDEL', w, other)
    end
  end
end

--- grantFirst (needs: clock, nextToken, publish, clientChannel)
-- grantFirst gives a free lock key (no key, or released with the last token last) to the first
-- live entry of its queue q (entries w), dropping the expired entries before it: the lock is
-- that entry's owner's, with a new token (nextToken), until the entry would have lapsed (at
-- most its window: a grant to a client that died waiting costs the others no more than its
-- entry would have), and the entry leaves the queue. One message tells the grantee's client,
-- on its client channel of the release channel rel (nil for <key>:rel); the clients queued
-- behind learn of the grant when they next refresh their entries (queue.lua reports how long
-- the lock is granted for), every third of a window: in time, when the grant lasts longer than
-- that. An entry refreshed on time has at least two thirds of its window left; one with less
-- is of a client that may have died, whose grant may lapse before the next client's refresh:
-- the client queued next is then told too, and tries as soon as the grant lapses. It returns
-- the grant's time (ms, in decimal), its token, and the announcement for the release channel,
-- "g <token> <entry id> <ms>" (the caller sends it: announce); nil when the queue holds no live entry; false, granting nothing, when the first
-- live entry is of the client whose entry ids start with mine ("<client id>.": the caller's,
-- which takes the lock itself).
-- The entry leaves (ZREM, HDEL) before the lock's SET: on a server out of memory (see set) a
-- script's first write that may need memory is refused, and those need none but are writes,
-- so the SET that follows is never refused.
local function grantFirst(key, q, w, rel, pub, last, mine)
  local id, e
  while true do
    id = redis.call('ZRANGE', q, 0, 0)[1]
    if not id then
      return nil
    end
    clock()
    e = redis.call('HGET', w, id)
    if e and tonumber(string.sub(e, 1, string.find(e, ' ', 1, true) - 1)) > nowms then
      break
    end
    redis.call('ZREM', q, id)
    redis.call('HDEL', w, id)
  end
  if mine and string.sub(id, 1, #mine) == mine then
    return false
  end
  redis.call('ZREM', q, id)
  redis.call('HDEL', w, id)
  local token, text = nextToken(last)
  local exp, full, owner, meta = string.match(e, '^(%d+) (%d+) (%S+) (.*)$')
  local left = math.max(tonumber(exp) - nowms, 1)
  local win = string.format('%d', left)
  redis.call('SET', key, owner .. ' ' .. text .. ' 1 ' .. meta, 'PX', win)
  local msg = 'g ' .. text .. ' ' .. id .. ' ' .. win
  rel = rel or key .. ':rel'
  local to = clientChannel(rel, id)
  publish(pub, to, msg)
  if 3 * left < 2 * tonumber(full) then
    local nxt = redis.call('ZRANGE', q, 0, 0)[1]
    local after = nxt and clientChannel(rel, nxt)
    if after and after ~= to then
      publish(pub, after, msg)
    end
  end
  return win, token, msg
end
