-- The fence check every fenced script starts with (after lib_prelude.lua).
-- hearth_fence(key, es) compares the writer's epoch es (its decimal string)
-- with the fence key: false when a newer epoch holds it; otherwise it raises
-- the fence to es (or overwrites a foreign value) and returns true. Its second
-- result describes a foreign value it found, nil when none. hearth_reply(code,
-- found) is the script's reply: code alone, or {code, found} after a repair.
--
-- Epochs compare as numbers (they stay below 2^53, exact in Lua) and the fence
-- is stored as the writer's own decimal string. A fence that holds anything
-- but a valid epoch (NaN compares false both ways, and a far-future number
-- would refuse every write for good) is treated as absent and overwritten
-- with the writer's epoch, and a TTL on a valid fence is removed.
local function hearth_fence(key, es)
  local e = tonumber(es)
  local f, bad = hearth_epoch(key, e)
  if f > e then return false, bad end
  if f < e or bad then redis.call('SET', key, es) end
  return true, bad
end
local function hearth_reply(code, found)
  if found then return {code, found} end
  return code
end
