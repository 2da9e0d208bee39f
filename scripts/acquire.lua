-- acquire: take the lock, re-enter it as the same owner, or queue for it, in one atomic step.
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
--          microseconds when absent). In quorum mode the client gives the same place on
--          every server, so that every server orders the same clients the same way.
-- ARGV[10] optional, the adaptive lease: its least and ARGV[11] its greatest lease in ms. The
--          lease of a new hold (taken or claimed) is then chosen from the name's hold record
--          KEYS[4] (<lock key>:h, see release.lua) instead of ARGV[2]: three times its
--          high-water hold, within [ARGV[10], ARGV[11]]; ARGV[11] when the name has no record.
--          (ARGV[9] is then given, "" for the server's time.)
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
local function publish(channel, payload)
  local cmd = 'PUBLISH'
  if ARGV[6] == 's' then
    cmd = 'S' .. cmd -- built at run time: some embedded test servers refuse unknown names at compile time
  end
  redis.call(cmd, channel, payload)
end
-- client returns the channel of the client whose entry id ("<client id>.<sequence>") is id.
local function client(id)
  return ARGV[5] .. ':' .. (string.match(id, '^([^.]*)%.') or id)
end
-- grant announces a grant to entry id as release.lua does: to its client, to the client
-- queued next, and on the release channel if anyone listens there.
local function grant(id, msg)
  local to = client(id)
  publish(to, msg)
  local nxt = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if nxt and client(nxt) ~= to then
    publish(client(nxt), msg)
  end
  local listened
  if ARGV[6] == 's' then
    listened = redis.call('PUBSUB', 'SHARDNUMSUB', ARGV[5])[2] > 0
  else
    listened = redis.call('PUBSUB', 'NUMSUB', ARGV[5])[2] > 0 or redis.call('PUBSUB', 'NUMPAT') > 0
  end
  if listened then
    publish(ARGV[5], msg)
  end
end
local function enqueue(now)
  local ms = now[1] * 1000 + math.floor(now[2] / 1000)
  local win = tonumber(ARGV[8])
  local place = tonumber(ARGV[9] or '') or now[1] * 1000000 + now[2]
  redis.call('ZADD', KEYS[2], 'NX', place, ARGV[7])
  redis.call('HSET', KEYS[3], ARGV[7], string.format('%d', ms + win) .. ' ' .. ARGV[8] .. ' ' .. ARGV[1] .. ' ' .. ARGV[3])
  local keep = math.max(win, redis.call('PTTL', KEYS[2]))
  redis.call('PEXPIRE', KEYS[2], keep)
  redis.call('PEXPIRE', KEYS[3], keep)
end
-- first returns the id and entry of the first queued client whose entry has not expired,
-- dropping the expired ones before it.
local function first(now)
  local ms = now[1] * 1000 + math.floor(now[2] / 1000)
  while true do
    local id = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not id then
      return nil
    end
    local e = redis.call('HGET', KEYS[3], id)
    if e and tonumber(string.sub(e, 1, string.find(e, ' ', 1, true) - 1)) > ms then
      return id, e
    end
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
  end
end

local ttl, lease = ARGV[2], nil
if ARGV[10] then
  -- The adaptive lease: "<count> <typical µs> <high µs> <last µs>" (release.lua writes it).
  lease = tonumber(ARGV[11])
  local r = redis.call('GET', KEYS[4])
  local high = r and tonumber(string.match(r, '^%d+ %d+ (%d+)'))
  if high then
    lease = math.min(lease, math.max(tonumber(ARGV[10]), math.ceil(3 * high / 1000)))
  end
  ttl = lease
end

local v = redis.call('GET', KEYS[1])
local o = ARGV[1]
local last
if v then
  -- Fields are parsed with string.byte/find/sub where possible: pattern matching costs the
  -- server more, and these are the hottest paths (a free name, a released one, a busy one).
  if string.byte(v, #o + 1) == 32 and string.find(v, o, 1, true) == 1 then
    local t, n, m = string.match(v, '^%S+ (%d+) (%d+) ?(.*)$')
    if ARGV[4] == 'r' then
      n = tonumber(n) + 1
      redis.call('SET', KEYS[1], o .. ' ' .. t .. ' ' .. n .. ' ' .. m, 'PX', ARGV[2])
      return {1, tonumber(t), n}
    end
    -- Granted to the caller's queue entry, and the caller had not heard: it takes its lease.
    redis.call('PEXPIRE', KEYS[1], ttl)
    return {1, tonumber(t), tonumber(n), lease}
  end
  if ARGV[4] == 'r' then
    return {0, -2, 0}
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
    if ARGV[4] == 'q' then
      enqueue(redis.call('TIME'))
    end
    return {0, redis.call('PTTL', KEYS[1]), t, lease}
  end
end
local now = redis.call('TIME')
local token = now[1] * 1000000 + now[2]
if last and last + 16 > token then
  token = last + 16
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  local id, e = first(now)
  -- An entry id is "<client id>.<sequence>": an entry of the caller's own client (an older
  -- registration it has withdrawn, or not yet) does not stand before the caller.
  local mine = string.match(ARGV[7], '^[^.]*%.')
  if id and mine and string.sub(id, 1, #mine) == mine then
    for _, other in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
      if string.sub(other, 1, #mine) == mine then
        redis.call('ZREM', KEYS[2], other)
        redis.call('HDEL', KEYS[3], other)
      end
    end
    id = nil
  end
  if id then
    -- A client queued before the caller: the lock is its, for the acceptance window.
    local win, owner, meta = string.match(e, '^%d+ (%d+) (%S+) (.*)$')
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('SET', KEYS[1], owner .. ' ' .. string.format('%d', token) .. ' 1 ' .. meta, 'PX', win)
    grant(id, 'g ' .. string.format('%d', token) .. ' ' .. id .. ' ' .. win)
    if ARGV[4] == 'q' then
      enqueue(now)
    end
    return {0, tonumber(win), token, lease}
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. string.format('%d', token) .. ' 1 ' .. ARGV[3], 'PX', ttl)
return {1, token, 1, lease}
