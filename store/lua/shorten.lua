-- KEYS key; ARGV ms. Takes ARGV[1] milliseconds off the key's TTL, counted
-- from its own expiry, so that when the script runs does not matter: a copy
-- whose write took longer than its TTL allowed for ends where it should have.
-- A key whose remaining TTL is not longer than that is deleted; an absent key,
-- or one without a TTL, is left alone. Replies 1 when it changed the key.
local by = tonumber(ARGV[1])
local t = redis.call('PTTL', KEYS[1])
if t <= 0 or not by or by <= 0 then
  return 0
end
if t <= by then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('PEXPIRE', KEYS[1], t - by)
return 1
