-- KEYS value, fence, version record; ARGV epoch, value, ttl ms, seq, version
-- (20 digits or empty), hash, record ttl ms, suspect record (or empty).
-- Replies {code, fence found, record found, reason, info} (lib_version.lua):
-- code 0 fenced, 1 written, 2 extended, 3 refused as older, 4 refused as older
-- by a record its value does not back. Idempotent: run twice, the second run
-- extends (same stamp and bytes) or refuses.
local ok, bad = hearth_fence(KEYS[2], ARGV[1])
bad = bad or ''
if not ok then return {0, bad, '', '', ''} end
local code, vbad, why, info = hearth_versioned_set(tonumber(ARGV[1]), ARGV[1], KEYS[1], KEYS[3], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
return {code, bad, vbad, why, info}
