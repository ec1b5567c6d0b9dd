-- KEYS fence; ARGV epoch, the fence's value f as a raise just saw it, the
-- epoch counter's value c read after that. If the fence still holds exactly
-- f, f > c and f > TIME, it is set to c (an epoch no Hearth instance was
-- issued), then raised as raise.lua does. Replies like raise.lua, plus 1 when
-- it repaired.
local fixed = 0
local v = redis.pcall('GET', KEYS[1])
if v == ARGV[2] and tonumber(ARGV[2]) > tonumber(ARGV[3]) and tonumber(ARGV[2]) > hearth_now_ms() then
  redis.call('SET', KEYS[1], ARGV[3])
  fixed = 1
end
local r = hearth_raise()
table.insert(r, fixed)
return r
