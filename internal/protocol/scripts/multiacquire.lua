-- uses: clock, nextToken, released, holderToken, enqueue, announce, grantFirst, dropClient
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
-- entry's client's channel <key>:rel:<client id>, and on the release channel <key>:rel when anyone may listen there: a subscriber of it, or,
-- not on a Cluster, of any pattern), and counts as busy.
-- New tokens follow acquire.lua's rule: max(last token + 16, server time in microseconds).
local n = #KEYS / 3
clock()
local mine = string.match(ARGV[6], '^[^.]*%.')
local at = 0 -- queue nowhere
if ARGV[7] == '*' then
  at = -1
elseif ARGV[7] ~= '' then
  at = tonumber(ARGV[7])
end
local eo = ARGV[8]

local tok, claim, clear = {}, {}, {}
local busy, pttl, btok = 0, 0, 0
for i = 1, n do
  local k, q, w = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local v = redis.call('GET', k)
  local last
  if v then
    local gone, lt = released(v)
    if at == i and string.byte(v, #eo + 1) == 32 and string.find(v, eo, 1, true) == 1 then
      claim[i] = tonumber(string.match(v, '^%S+ (%d+) '))
    elseif gone then
      last = lt
    else
      -- held by another owner (or not a lock value): its remaining lease and its token
      busy, pttl, btok = i, redis.call('PTTL', k), holderToken(v)
      break
    end
  end
  if not claim[i] then
    local win, t, msg
    if not v then -- a released value means an empty queue (see acquire.lua)
      win, t, msg = grantFirst(k, q, w, nil, ARGV[5], last, mine)
    end
    if win then
      -- A client queued before the caller (not of its client) has the lock now.
      announce(ARGV[5], k .. ':rel', msg)
      busy, pttl, btok = i, tonumber(win), t
      break
    end
    clear[i] = win == false -- the caller's client's own entries leave when it takes the lock
    local _, text = nextToken(last)
    tok[i] = text
  end
end

if busy > 0 and (at == -1 or at == busy) then
  -- Queue the caller's entry at the busy lock (or refresh it, keeping its place).
  enqueue(KEYS[3 * busy - 1], KEYS[3 * busy], ARGV[6], eo, ARGV[3], ARGV[9])
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
    local o = at == i and eo or ARGV[1] -- the lock the caller queued at is its entry's owner's
    redis.call('SET', k, o .. ' ' .. tok[i] .. ' 1 ' .. ARGV[3], 'PX', ARGV[2])
    r[3 + i] = tonumber(tok[i])
    if clear[i] then
      dropClient(KEYS[3 * i - 1], KEYS[3 * i], mine)
    end
  end
end
return r
