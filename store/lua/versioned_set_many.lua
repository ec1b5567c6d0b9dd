-- versioned_set.lua for many keys under one fence key (a single node): KEYS
-- fence, then value and record for each key; ARGV epoch, seq and record ttl
-- ms (one load's, shared by every key of the call), then value, ttl ms,
-- version and hash for each key, then i and its suspect record for each key i
-- (from 1) that has one (most have none: passed once each, they would be
-- most of a call's arguments). Replies {0, fence found} when fenced (no key
-- written), else {1, fence found, codes, then i, record found, reason, info
-- for each key i where one of those is not empty}, codes one digit per key:
-- most keys need nothing but their code, so the reply carries nothing else
-- for them.
local ok, bad = hearth_fence(KEYS[1], ARGV[1])
bad = bad or ''
if not ok then return {0, bad} end
local e = tonumber(ARGV[1])
local n = (#KEYS - 1) / 2
local suspect = {}
for j = 4 + 4 * n, #ARGV - 1, 2 do
  suspect[tonumber(ARGV[j])] = ARGV[j+1]
end
local codes = {}
local out = {1, bad, ''}
for i = 1, n do
  local b = 3 + 4 * (i - 1)
  local code, vbad, why, info = hearth_versioned_set(e, ARGV[1], KEYS[2*i], KEYS[2*i+1], ARGV[b+1], ARGV[b+2], ARGV[2], ARGV[b+3], ARGV[b+4], ARGV[3], suspect[i])
  codes[i] = code
  if vbad ~= '' or why ~= '' or info ~= '' then
    out[#out+1] = i
    out[#out+1] = vbad
    out[#out+1] = why
    out[#out+1] = info
  end
end
out[3] = table.concat(codes)
return out
