-- The version check of one key, shared by the one-key, the many-key and the
-- pre-warm's script (after lib_prelude.lua). hearth_versioned_set(e, es, vk,
-- rk, value, ttl, seq, ver, hash, vttl, suspect), run after the fence check
-- passed for epoch e (es its decimal string), writes value key vk and its
-- record rk, or refuses the write as older, or only extends vk's TTL (vk holds
-- these very bytes). It returns the code (1 written, 2 extended, 3 older, 4
-- older but the record is not backed by its value), a description of a
-- foreign record it repaired ("" when none), the reason of what it found wrong
-- ("" when nothing: record_malformed, record_unconfirmed, value_mismatch,
-- value_absent) and, with code 4, the record, else a description of the
-- foreign value. suspect, when not nil or "", is a record the caller's re-read
-- of the origin did not confirm: if rk still holds exactly it, it would refuse
-- the write and its value still does not back it, it is treated as absent. A
-- value's bytes never leave the script: a foreign value is described by its
-- length and a prefix of its SHA-1.
local hearth_vmax = '18446744073709551615'
local function hearth_vcmp(a, b)
  local a1, b1 = tonumber(string.sub(a, 1, 10)), tonumber(string.sub(b, 1, 10))
  if a1 ~= b1 then if a1 < b1 then return -1 end return 1 end
  local a2, b2 = tonumber(string.sub(a, 11)), tonumber(string.sub(b, 11))
  if a2 ~= b2 then if a2 < b2 then return -1 end return 1 end
  return 0
end
local function hearth_vdesc(vk, v)
  if type(v) == 'table' then return hearth_type(vk) end
  return string.len(v) .. ' bytes, sha1 ' .. string.sub(redis.sha1hex(v), 1, 12)
end
local function hearth_versioned_set(e, es, vk, rk, value, ttl, seqs, ver, hash, vttls, suspect)
  local seq, vttl = tonumber(seqs), tonumber(vttls)
  local vbad, why = '', ''
  local ce, cs, cv, ch, ca
  local cur = redis.pcall('GET', rk)
  if type(cur) == 'table' and cur.err then
    vbad = hearth_type(rk)
  elseif cur then
    local a, b, c, d = string.match(cur, '^(%d+):(%d+):(%d*):(%x+)$')
    if not a or string.len(a) > 16 or string.len(b) > 16 or
      (c ~= '' and (string.len(c) ~= 20 or c > hearth_vmax)) or
      (string.len(d) ~= 40 and string.len(d) ~= 32) then
      vbad = string.sub(cur, 1, 64)
    else
      ce, cs, cv, ch, ca = tonumber(a), tonumber(b), c, d, a
    end
  end
  local older, moved = false, false
  if ce then
    if ver ~= '' and cv ~= '' then
      older = ver ~= cv and hearth_vcmp(ver, cv) < 0
    else
      older = ce > e or (ce == e and cs > seq)
    end
    -- A record that would refuse or spare this write must be Hearth's: its TTL
    -- within what the declaration sets, its epoch not beyond TIME. One this
    -- write overwrites anyway is not looked at further.
    if not older and ch == hash and cv == ver and ver ~= '' and ce <= e then
      -- The common case, a record sparing a write of the same bytes: one
      -- PEXPIRE GT both checks its TTL and moves it (it sets the TTL only
      -- below vttl; a record without one, or with a longer one, is not
      -- Hearth's). No epoch to check: it is not beyond this writer's.
      if redis.call('PEXPIRE', rk, vttl, 'GT') == 1 then
        moved = true
      else
        local pt = redis.call('PTTL', rk)
        if pt < 0 or pt > vttl then
          vbad = 'ttl ' .. pt .. ': ' .. string.sub(cur, 1, 48)
        end
        moved = pt == vttl -- written this very millisecond
      end
      if vbad ~= '' then ce = nil end
    elseif older or (ch == hash and cv == ver) then
      local pt = redis.call('PTTL', rk)
      if pt < 0 or pt > vttl then
        vbad = 'ttl ' .. pt .. ': ' .. string.sub(cur, 1, 48)
      elseif ce > e and not hearth_epoch_ok(ca, hearth_now_ms()) then
        vbad = 'epoch ahead: ' .. string.sub(cur, 1, 48)
      end
      if vbad ~= '' then ce, older = nil, false end
    end
  end
  if vbad ~= '' then why = 'record_malformed' end
  if older then
    -- A record only protects the value it was written with: absent or other
    -- bytes, and the caller re-reads the origin rather than leave them.
    local v, lack = redis.pcall('GET', vk), ''
    if not v then
      lack = 'value_absent'
    elseif type(v) ~= 'string' or string.len(ch) ~= 40 or redis.sha1hex(v) ~= ch then
      lack = 'value_mismatch'
    end
    if lack == '' then return 3, vbad, '', '' end
    if not (suspect and suspect ~= '' and cur == suspect) then return 4, vbad, lack, cur end
    -- The origin, re-read after this record refused a write it did not back,
    -- is still older: a version the origin never confirmed.
    vbad, why = 'unconfirmed: ' .. string.sub(cur, 1, 52), 'record_unconfirmed'
    ce = nil
  end
  local info = ''
  if ce and ch == hash and cv == ver then
    -- The record says Redis holds these bytes: extend only if it does, byte
    -- for byte (same version and length prove nothing). GETEX reads the value
    -- and sets its TTL in one call: when the bytes differ (or vk holds another
    -- type, which GETEX leaves alone) the SET below replaces value and TTL.
    local v = redis.pcall('GETEX', vk, 'PX', ttl)
    if v == value then
      -- Only the TTLs move. A record with a version orders writes by it, so
      -- its epoch:seq need not move either: it keeps the write that set the
      -- version, and costs Redis an expiry instead of a new string. One with
      -- none orders by epoch:seq, which must move to this load's.
      if ver == '' then
        redis.call('SET', rk, es .. ':' .. seqs .. ':' .. ver .. ':' .. hash, 'PX', vttl)
      elseif not moved then
        redis.call('PEXPIRE', rk, vttl)
      end
      return 2, vbad, why, ''
    end
    if v then
      why, info = 'value_mismatch', hearth_vdesc(vk, v) .. ' where hearth wrote ' .. string.len(value) .. ' bytes'
    end
  end
  redis.call('SET', vk, value, 'PX', ttl)
  redis.call('SET', rk, es .. ':' .. seqs .. ':' .. ver .. ':' .. hash, 'PX', vttl)
  return 1, vbad, why, info
end
