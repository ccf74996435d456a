-- Parks one call for approval: writes its hash and lists it as waiting, in one step.
-- KEYS[1] the call's approval hash; KEYS[2] the waiting set (call id -> requested at).
-- ARGV[1] call id; ARGV[2] expire seconds; ARGV[3] requested at; ARGV[4..] the hash's
-- fields and values.
-- A call parked before (the same call id: a model's replay, or the same batch run again)
-- keeps its first request and whatever was decided: returns 0; a new one returns 1.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
