-- Decides a parked call, exactly once: the first decision wins.
-- KEYS[1] the call's approval hash; KEYS[2] the waiting set.
-- ARGV[1] call id; ARGV[2] new state; ARGV[3] decided by; ARGV[4] reason.
-- Returns {"ok", decided_at} when this decision is the one, else {state, decided_by,
-- decided_at} of the decision already made, or {"missing"} when no such call was parked.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing'} end
if state ~= 'waiting' then
  local got = redis.call('HMGET', KEYS[1], 'decided_by', 'decided_at')
  return {state, got[1] or '', got[2] or ''}
end
local now = redis.call('TIME')
local at = string.format('%d.%06d', tonumber(now[1]), tonumber(now[2]))
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'decided_by', ARGV[3],
  'decision_reason', ARGV[4], 'decided_at', at)
redis.call('ZREM', KEYS[2], ARGV[1])
return {'ok', at}
