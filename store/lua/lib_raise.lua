-- hearth_raise() raises the fence KEYS[1] to the epoch ARGV[1], like
-- hearth_fence, and returns {code, found, fence}: code 1 raised or equal, 0 a
-- newer epoch holds it; found describes a foreign value repaired (empty if
-- none); fence is the epoch that refused the raise (empty when raised).
local function hearth_raise()
  local e = tonumber(ARGV[1])
  local f, bad = hearth_epoch(KEYS[1], e)
  if f > e then return {0, bad or '', string.format('%.0f', f)} end
  if f < e or bad then redis.call('SET', KEYS[1], ARGV[1]) end
  return {1, bad or '', ''}
end
