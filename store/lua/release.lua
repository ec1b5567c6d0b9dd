-- Deletes the lease KEYS[1] only if it still holds this term's value ARGV[1].
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
