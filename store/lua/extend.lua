-- KEYS value, fence; ARGV epoch, ttl ms. 1 extended (or already longer),
-- 0 key gone, -1 fenced.
local ok, bad = hearth_fence(KEYS[2], ARGV[1])
if not ok then return hearth_reply(-1, bad) end
local n = redis.call('EXISTS', KEYS[1])
if redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT') == 1 then n = 1 end
return hearth_reply(n, bad)
