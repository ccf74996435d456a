-- Appends one chunk of a branch's history (its events and messages), exactly once.
-- KEYS[1] events list; KEYS[2] history list; KEYS[3] written-count key ("" for none);
-- KEYS[4] open-batches hash ("" for none: the chunk does not complete its batch).
-- ARGV[1] count before; ARGV[2] count after; ARGV[3] ttl seconds; ARGV[4] number of events;
-- ARGV[5] batch id; then the events, then the messages.
-- Returns 1 when appended, 0 when the count shows the chunk is in already.
local n_events = tonumber(ARGV[4])
if KEYS[4] ~= '' then
  -- The chunk that completes its batch closes the journal in the same script (one
  -- round trip less per act()): every earlier chunk is in (they are written in order), this
  -- one is in once the script ends, and a chunk found in already closes it too (idempotent).
  redis.call('HDEL', KEYS[4], ARGV[5])
end
if KEYS[3] ~= '' then
  -- Advance the count and read the old one in one command (no separate GET); a chunk already in
  -- puts the count back and appends nothing.
  local current = redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[3], 'GET')
  if current and tonumber(current) >= tonumber(ARGV[2]) then
    redis.call('SET', KEYS[3], current, 'EX', ARGV[3])
    return 0
  end
end
local function push(key, first, last)
  local i = first
  while i <= last do
    local j = math.min(i + 499, last)
    redis.call('RPUSH', key, unpack(ARGV, i, j))
    i = j + 1
  end
  if last >= first then redis.call('EXPIRE', key, ARGV[3]) end
end
push(KEYS[1], 6, 5 + n_events)
push(KEYS[2], 6 + n_events, #ARGV)
return 1
