-- uses: publish
-- proclaim: an election's leader announces its term (Election.Campaign, once it leads) or a
-- new advertised value (Leadership.Proclaim), for its owner only.
-- KEYS[1]  lock key
-- ARGV[1]  owner secret of the leader's lease
-- ARGV[2]  the new holder description, or '' to keep the stored one
-- ARGV[3]  the lock's release channel
-- ARGV[4]  's' to announce with SPUBLISH (Redis Cluster, sharded pub/sub), else PUBLISH
-- Reply    the lock's token, after "l <token>" went out on the release channel; 0 when the
--          caller does not own the lock (nothing written, nothing announced).
local o = ARGV[1]
local v = redis.call('GET', KEYS[1])
if not v or string.byte(v, #o + 1) ~= 32 or string.find(v, o, 1, true) ~= 1 then
  return 0
end
local s2 = string.find(v, ' ', #o + 2, true)
if not s2 then
  return 0
end
local token = string.sub(v, #o + 2, s2 - 1)
if ARGV[2] ~= '' then
  local s3 = string.find(v, ' ', s2 + 1, true)
  local holds = string.sub(v, s2 + 1, (s3 or 0) - 1)
  redis.call('SET', KEYS[1], o .. ' ' .. token .. ' ' .. holds .. ' ' .. ARGV[2], 'KEEPTTL')
end
publish(ARGV[4], ARGV[3], 'l ' .. token)
return tonumber(token)
