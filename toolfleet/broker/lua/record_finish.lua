-- Stores a call's terminal record, drops its started marker and notifies, atomically (C7).
-- KEYS[1] the record (event key); KEYS[2] the started marker; KEYS[3] the reply list ("" for
-- none).
-- ARGV[1] record JSON; ARGV[2] attempt; ARGV[3] ttl seconds.
-- The first record of an attempt wins: returns 0, changing nothing, when a record of this or
-- a later attempt is there; else 1. SET ... GET writes and reads the previous record in one
-- command (the common case, no earlier record, costs no separate GET); the rare loser puts
-- the winner's record back.
local current = redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3], 'GET')
if current then
  local ok, decoded = pcall(cjson.decode, current)
  local attempt = ok and type(decoded) == 'table' and tonumber(decoded['attempt']) or 0
  if attempt >= tonumber(ARGV[2]) then
    redis.call('SET', KEYS[1], current, 'EX', ARGV[3])
    return 0
  end
end
redis.call('DEL', KEYS[2])
if KEYS[3] ~= '' then
  redis.call('RPUSH', KEYS[3], ARGV[1])
  redis.call('EXPIRE', KEYS[3], ARGV[3])
end
return 1
