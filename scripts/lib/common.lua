-- The script library: helpers that several scripts need, each written once here. A script asks
-- for the ones it uses on its first line, as "-- uses: publish, clientChannel"; the library
-- (scripts.go, assemble) puts those blocks, in this file's order, before the script's own text,
-- and the script's SHA is that of the assembled source (dlock.Scripts() gives it). Only what a
-- script asks for is built when it runs: a local function costs a closure on every call.
-- Each block starts at a line "--- <name>"; "(needs: a, b)" after the name pulls those in too.

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

--- grantNotice (needs: publish, clientChannel)
-- grantNotice tells of a grant to queue entry id of the lock whose release channel is rel and
-- queue q: msg goes to the grantee's client, and to the client queued next when that is
-- another (it then knows the lock is taken and by when to look again).
local function grantNotice(pub, q, rel, id, msg)
  local to = clientChannel(rel, id)
  publish(pub, to, msg)
  local nxt = redis.call('ZRANGE', q, 0, 0)[1]
  if nxt then
    local after = clientChannel(rel, nxt)
    if after ~= to then
      publish(pub, after, msg)
    end
  end
end
