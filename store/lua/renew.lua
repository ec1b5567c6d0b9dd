-- Extends the lease KEYS[1] by ARGV[2] ms only if it still holds this term's
-- value ARGV[1] (a key of another type is not this term's lease: pcall).
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
