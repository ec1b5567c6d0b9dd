-- KEYS value, fence; ARGV epoch, value, ttl ms. 1 written, 0 fenced
-- (hearth_reply: {code, found} after a fence repair).
local ok, bad = hearth_fence(KEYS[2], ARGV[1])
if not ok then return hearth_reply(0, bad) end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return hearth_reply(1, bad)
