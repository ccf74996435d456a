-- Takes over a call's started marker only while it is absent, unreadable or still stale,
-- so two redeliveries never both run the tool.
-- KEYS[1] the started marker.
-- ARGV[1] our marker's JSON; ARGV[2] now (epoch s); ARGV[3] stale after (s); ARGV[4] ttl s.
-- Returns 1 when ours now, else the live holder's marker JSON.
local current = redis.call('GET', KEYS[1])
if current then
  local ok, data = pcall(cjson.decode, current)
  local beat_at = ok and type(data) == 'table' and tonumber(data['beat_at'])
  if beat_at and beat_at > tonumber(ARGV[2]) - tonumber(ARGV[3]) then
    return current
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[4])
return 1
