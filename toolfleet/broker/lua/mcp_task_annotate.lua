-- Sets fields on an MCP task that still exists (one that expired is not recreated without
-- its expiry).
-- KEYS[1] the task hash. ARGV[1] now (epoch s, written as updated_at); ARGV[2..] field/value
-- pairs.
-- Returns 1 when written, 0 when the task is gone.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[1])
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
