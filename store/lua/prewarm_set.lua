-- KEYS value, fence; ARGV epoch, value, ttl ms, overwrite ("1" or "0").
-- Replies 1 written, 2 present (left alone), 0 fenced; {code, found} when the
-- fence held a foreign value, which counts as absent and is left for the
-- leader to repair. A fence is a newer epoch only when it is written as Hearth
-- writes one (digits only, no leading zero).
local e = tonumber(ARGV[1])
local f = redis.pcall('GET', KEYS[2])
local bad = nil
if type(f) == 'table' and f.err then
  bad = 'wrong type'
elseif f then
  if string.len(f) > 16 or not (f == '0' or string.match(f, '^[1-9]%d*$')) then
    bad = string.sub(f, 1, 64)
  elseif tonumber(f) > e then
    return 0
  end
end
local r
if ARGV[4] == '1' then
  r = redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
else
  r = redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3], 'NX')
end
local code = 1
if not r then code = 2 end
if bad then return {code, bad} end
return code
