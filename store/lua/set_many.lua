-- KEYS fence, value 1 … value n; ARGV epoch, then value and ttl ms for each
-- key. 1 all written, 0 all fenced: one fence guards them all, so one check
-- decides for every key.
local ok, bad = hearth_fence(KEYS[1], ARGV[1])
if not ok then return hearth_reply(0, bad) end
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], ARGV[2*i-2], 'PX', ARGV[2*i-1])
end
return hearth_reply(1, bad)
