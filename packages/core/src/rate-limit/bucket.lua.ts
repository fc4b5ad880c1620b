// Lua for the Redis token bucket: the same GCRA rules as gcra.ts, with time read from the Redis server.
import { Script } from '../redis/script.js';

// One take, as a Lua function of the bucket's key and the cost, run by TAKE for one call and by its batch form for many.
// `now`, `burst`, `interval` and `commit` are set before it. Its arithmetic is relative to `now`, so the numbers stay
// small and exact. The key holds the TAT in µs and expires when the bucket is full again, so a full bucket leaves no key.
const TAKE_FUNCTION = `
local function take(key, cost)
  -- How far the TAT lies ahead of now (0: the bucket is full).
  local ahead = tonumber(redis.call('GET', key) or '0') - now
  if ahead < 0 then ahead = 0 end
  -- Further ahead than a whole burst means the server clock went back (NTP step, failover to a host whose clock is
  -- behind): count the bucket as empty, not as locked for the length of the jump, and let a take write the clamped TAT.
  local stale = ahead > burst
  if stale then ahead = math.floor(burst) end
  local stored = 0
  if commit then
    -- Whole µs per take, at least 1: a tiny cost still costs something.
    local later = ahead + math.ceil(cost * interval)
    local write = 0                     -- how far ahead of now the TAT to write lies; 0: nothing to write
    if later <= burst then
      write = later
    elseif stale then
      write = ahead
    end
    if write ~= 0 then
      stored = now + write
      -- %d keeps all digits; Lua's default number format would round them away. The key expires when the bucket is full.
      redis.call('SET', key, string.format('%d', stored), 'PX', math.ceil(write / 1000))
    end
  end
  return ahead, stored
end
`;

// What both forms read first: the bucket's parameters and whether to take, then the server's clock.
const TAKE_PARAMETERS = `
local capacity = tonumber(ARGV[1])      -- tokens
local interval = tonumber(ARGV[2])      -- µs per token
local commit = ARGV[3] == '1'           -- '1' take, '0' peek
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local burst = capacity * interval
`;

/**
 * Take (or peek at) `cost` tokens: KEYS = [the bucket's TAT], ARGV = [capacity, µs per token, '1' take or '0' peek,
 * cost]. Returns {ahead, stored}: how far (µs) the bucket's TAT lay ahead of the server clock before this call
 * (clamped to a burst), from which `decide` in JavaScript computes the decision with the same arithmetic, and the TAT
 * this take wrote (0 when it wrote nothing), for a REFUND if its caller gave up on it. Two integers rather than the
 * decision's five numbers: each reply element costs the server and the client time.
 *
 * Takes merged into one command from the same bucket parameters run in its batch form, which reads the clock once and
 * answers a flat list of both numbers per take; a take that fails there (a key of another type) fails alone.
 */
export const TAKE = new Script(
  `${TAKE_PARAMETERS}${TAKE_FUNCTION}
local ahead, stored = take(KEYS[1], tonumber(ARGV[4]))
return {ahead, stored}
`,
  {
    patient: true, // every caller awaits it; see Script
    sharedClock: true,
    batch: {
      source: `${TAKE_PARAMETERS}${TAKE_FUNCTION}
local out = {}
for i = 1, #KEYS do
  local ok, ahead, stored = pcall(take, KEYS[i], tonumber(ARGV[3 + i]))
  if not ok then
    if type(ahead) ~= 'table' or not ahead.err then ahead = {err = tostring(ahead)} end
    stored = 0
  end
  out[2 * i - 1] = ahead
  out[2 * i] = stored
end
return out
`,
      keys: 1,
      args: 4,
      shared: 3,
      width: 2,
    },
  },
);

/**
 * Give back what a take that its caller never saw (it timed out) spent: only while the key still holds exactly the TAT
 * that take stored, i.e. nothing touched the bucket since, so that removing its cost restores the bucket as it was. Once
 * another take has built on it, the tokens stay spent: removing them then could admit more than the bucket allows.
 * 1 when given back, 0 when not.
 */
export const REFUND = new Script(`
local key = KEYS[1]                 -- the bucket's TAT, µs
local stored = ARGV[1]              -- the TAT the lost take stored
local spent = tonumber(ARGV[2])     -- µs it added

if redis.call('GET', key) ~= stored then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(stored) - spent
if tat <= now then
  redis.call('DEL', key)
else
  redis.call('SET', key, string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000))
end
return 1
`);
