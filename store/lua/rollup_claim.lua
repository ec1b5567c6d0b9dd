-- Hands the access-log roller the next thing to roll up for one bucket, in
-- one atomic step. KEYS: the bucket, its private name, the token of the
-- roll-up of the private name. ARGV: a fresh token, the token's TTL in ms.
-- Returns {"resume", token}, {"resume_new", token}, {"claimed", token},
-- {"foreign", type} or {"none"} (accesslog/rollup.go).
local function valid(t)
  return type(t) == 'string' and #t == 32 and not string.find(t, '[^0-9a-f]')
end
local pt = redis.call('TYPE', KEYS[2]).ok
if pt == 'zset' then
  local t = redis.pcall('GET', KEYS[3])
  if valid(t) then return {'resume', t} end
  redis.call('DEL', KEYS[3])
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
  return {'resume_new', ARGV[1]}
end
if pt ~= 'none' then
  redis.call('UNLINK', KEYS[2], KEYS[3])
  return {'foreign', pt}
end
local bt = redis.call('TYPE', KEYS[1]).ok
if bt == 'none' then return {'none'} end
if bt ~= 'zset' then
  redis.call('UNLINK', KEYS[1])
  return {'foreign', bt}
end
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
return {'claimed', ARGV[1]}
