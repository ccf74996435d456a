-- Drops a call's started marker only while it is still ours (never someone else's).
-- KEYS[1] the started marker. ARGV[1] our marker's JSON.
-- Returns 1 when dropped, 0 when the marker is gone or another delivery's.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
