-- Takes the lease if it is free, or held by an earlier attempt of
-- this same instance, under a new epoch = max(last epoch + 1, Redis time in ms):
-- strictly increasing, and still increasing if Redis lost its data. A
-- retransmission of the same attempt (same token) returns the same epoch, so
-- the script is idempotent.
--
-- What the keys hold is checked first (Hearth's own keys are untrusted), and
-- a lease no Hearth instance could hold is taken over at once, atomically:
-- one that is not <epoch>:<id>/<attempt> with a valid epoch, or not a string;
-- one without a TTL (every Hearth write and renewal sets PX), or with more
-- left than HEARTH_LEASE_TTL_FACTOR × this instance's lease; one whose epoch is not
-- the epoch counter's (this script sets both together, so a Hearth lease
-- always holds the counter's epoch). A lease that passes all that but that
-- the caller saw unrenewed for a whole lease is taken over too, when ARGV
-- names it (value and expiry as the caller last saw them) and it is still
-- exactly that: a compare-and-set, so a holder that renewed meanwhile is never
-- stolen from. An epoch counter that is not a valid epoch counts as absent, so
-- the new epoch is Redis time, never a value derived from the foreign one.
--
-- KEYS lease, epoch; ARGV token, instance id, lease ms, then optionally the
-- unrenewed lease's value, its expiry (Redis ms) and for how long it was seen
-- unrenewed (ms, for the log). Returns {epoch, holder, expiry, kind, found,
-- why, …}: epoch is "" when another instance leads, holder and expiry are then
-- its lease value and when it expires (Redis ms), and each kind/found/why
-- triple is one repaired key (lease or epoch).
local now = hearth_now_ms()
local out = {'', '', ''}
local function repaired(kind, found, why)
  table.insert(out, kind)
  table.insert(out, string.sub(found, 1, HEARTH_FOUND_MAX))
  table.insert(out, why or '')
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' and cur.err then
  repaired('lease', hearth_type(KEYS[1]))
  cur = false
end
local last, bad = hearth_epoch(KEYS[2], nil, now)
if bad then repaired('epoch', bad) end
if cur then
  local e, id, n = string.match(cur, '^(%d+):([^:/]+)/(%d+)$')
  if e == nil or not hearth_epoch_ok(e, now) then
    repaired('lease', cur)
  elseif id .. '/' .. n == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    out[1] = e
    return out
  elseif id ~= ARGV[2] then
    local pttl = redis.call('PTTL', KEYS[1])
    local ms = tonumber(ARGV[3])
    if pttl == -1 then
      repaired('lease', 'no ttl: ' .. cur, 'no ttl')
    elseif pttl > ms * HEARTH_LEASE_TTL_FACTOR then
      repaired('lease', cur, 'ttl ' .. pttl .. 'ms, over ' .. HEARTH_LEASE_TTL_FACTOR .. ' x the lease ' .. ms .. 'ms')
    elseif tonumber(e) ~= last then
      repaired('lease', cur, 'epoch ' .. e .. ' never issued: the epoch counter holds ' .. string.format('%.0f', last))
    elseif ARGV[4] == cur and math.abs(now + pttl - tonumber(ARGV[5])) <= HEARTH_RENEW_TOLERANCE_MS then
      repaired('lease', cur, 'not renewed for ' .. ARGV[6] .. 'ms, ttl ' .. pttl .. 'ms')
    else
      out[2] = cur
      out[3] = string.format('%.0f', now + pttl)
      return out
    end
  end
end
local e = now
if last >= e then e = last + 1 end
local es = string.format('%.0f', e)
redis.call('SET', KEYS[2], es)
redis.call('SET', KEYS[1], es .. ':' .. ARGV[1], 'PX', ARGV[3])
out[1] = es
return out
