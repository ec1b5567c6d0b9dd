-- Checks the re-warm marker KEYS[1] and writes it back (Redis TIME, unix
-- seconds, no TTL) when it is absent or foreign (not the decimal unix seconds
-- Hearth writes, at most HEARTH_AHEAD_MS ahead of Redis TIME; another Redis
-- type; a TTL, which no Hearth sets), or always with ARGV[1] = '1'. Returns
-- {state, found}: state ok, absent or foreign; found is what a foreign marker
-- held, truncated.
local t = redis.call('TIME')
local now = tonumber(t[1])
local state, found = 'ok', ''
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  state, found = 'foreign', hearth_type(KEYS[1])
elseif not v then
  state = 'absent'
elseif string.len(v) > 12 or not string.match(v, '^%d+$') or tonumber(v) > now + HEARTH_AHEAD_MS / 1000 then
  state, found = 'foreign', v
elseif redis.call('PTTL', KEYS[1]) >= 0 then
  state, found = 'foreign', 'ttl set: ' .. v
end
if state ~= 'ok' or ARGV[1] == '1' then redis.call('SET', KEYS[1], t[1]) end
return {state, string.sub(found, 1, HEARTH_FOUND_MAX)}
