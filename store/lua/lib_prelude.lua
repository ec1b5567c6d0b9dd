-- The prelude of every script that reads Hearth's own keys (fence, lease,
-- epoch counter, re-warm marker, version records). It follows the constants
-- the Go side prepends (store/scripts.go: HEARTH_AHEAD_MS, HEARTH_FOUND_MAX,
-- ...), so that a number is written once, in Go.
--
-- An epoch is valid when it is written as Hearth writes it, a decimal integer
-- in its one canonical form (digits only, no leading zero: no sign, exponent,
-- nan, inf, padding), of at most 16 digits, no later than Redis TIME +
-- HEARTH_AHEAD_MS. Another form of the same number is foreign too: the
-- repairs compare-and-set against the canonical form, so a fence planted as
-- 0<epoch> was never matched and held writes off until TIME passed it.
--
-- hearth_epoch(key, e, now) returns the epoch a key holds (0 when absent) and,
-- when the key holds anything else (a foreign value or another Redis type), a
-- description of it, with 0: the caller treats it as absent and overwrites it.
-- A valid epoch with a TTL (no Hearth sets one; its expiry would silently lift
-- the fence) is kept, the TTL removed, and described too. e is the writer's
-- epoch: a value at or below it is overwritten anyway, so TIME (the bound) and
-- the TTL are only looked at when it is not below e, which keeps the common
-- write (fence == writer's epoch) at one GET and one PTTL. now is Redis TIME
-- in ms if the caller has it, else nil.
local function hearth_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function hearth_type(key)
  local t = redis.call('TYPE', key)
  return 'wrong type: ' .. tostring(t.ok or t)
end
local function hearth_canonical(s)
  return string.len(s) <= 16 and (s == '0' or string.match(s, '^[1-9]%d*$') ~= nil)
end
local function hearth_epoch_ok(s, now)
  if type(s) ~= 'string' or not hearth_canonical(s) then return false end
  return tonumber(s) <= now + HEARTH_AHEAD_MS
end
local function hearth_epoch(key, e, now)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then return 0, hearth_type(key) end
  if not v then return 0, nil end
  if not hearth_canonical(v) then return 0, string.sub(v, 1, HEARTH_FOUND_MAX) end
  local n = tonumber(v)
  if e and n < e then return n, nil end
  if n ~= e and n > (now or hearth_now_ms()) + HEARTH_AHEAD_MS then return 0, v end
  if redis.call('PTTL', key) >= 0 then
    redis.call('PERSIST', key)
    return n, 'ttl set: ' .. v
  end
  return n, nil
end
