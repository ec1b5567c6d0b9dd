-- A one-shot pre-warm's write of a stamped entry into a Redis where a leader
-- runs: KEYS value, fence, version record; ARGV epoch, value, ttl ms, seq,
-- version (20 digits or empty), hash, record ttl ms, overwrite ("1" or "0").
-- It reads the fence and never raises it (a foreign fence counts as absent and
-- is left to the leader). Replies {code, fence found, record found}: 0 fenced,
-- 1 written, 2 extended, 3 older, 4 older by an unbacked record, 5 present.
local e = tonumber(ARGV[1])
local f, bad = hearth_epoch(KEYS[2], e)
bad = bad or ''
if f > e then return {0, bad, ''} end
if ARGV[8] ~= '1' and redis.call('EXISTS', KEYS[1]) == 1 then return {5, bad, ''} end
local code, vbad = hearth_versioned_set(e, ARGV[1], KEYS[1], KEYS[3], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
return {code, bad, vbad}
