// Lua for the Redis token bucket: the same GCRA rules as gcra.ts, with time read from the Redis server.
import { Script } from '../redis/script.js';

/**
 * Granularity of a bucket key's expiry, µs. A key expires at the end of the second (on this grid, server time) in
 * which its bucket is full again, not at that exact instant: a take whose TAT stays in the same second then rewrites
 * the value and keeps the expiry (SET KEEPTTL), which costs Redis about a quarter less than setting a new one. Under
 * steady traffic a key's TAT moves on by small steps, so most takes stay in their second. A full bucket's key lingers
 * for at most this long; a key that lingers reads as a full bucket, as a missing one does.
 */
export const EXPIRY_GRID_US = 1_000_000;

// The expiry every writer of a bucket key (TAKE, REFUND) gives it, as a Lua function of the grid second its TAT lies in
// (the TAT in µs over `grid`). `now` (server µs) is set before it.
const EXPIRY_FUNCTION = `
local grid = ${EXPIRY_GRID_US}
-- Ms from now to the end of that second, plus one: PX counts from a time Redis takes for the command, in whole ms,
-- which depending on the version may be cached from before this script read the clock; one ms more keeps the expiry
-- at or after the end of the second.
local function expiryAfter(second)
  return (second + 1) * (grid / 1000) - math.floor(now / 1000) + 1
end
`;

// One take, as a Lua function of the bucket's key, its value as read before (false: no key), the cost, and whether this
// command already wrote the key (`again`: then the value is that write's), run by TAKE for one call and by its batch
// form for many. `now`, `burst`, `interval`, `commit`, `written` and `dirty` are set before it.
// Its arithmetic is relative to `now`, so the numbers stay small and exact. Returns how far the TAT lay ahead of now
// and the TAT it stored (0: none), or false and an error message.
//
// The value is the TAT in µs, in decimal: Redis keeps such a value inside the key's object (an integer encoding),
// with no allocation of its own. Every writer (TAKE, REFUND) keeps the expiry at or after the end of the TAT's second
// on the grid, which is what lets a new TAT in the same second keep it.
const TAKE_FUNCTION = `${EXPIRY_FUNCTION}
local wrongType = 'WRONGTYPE Operation against a key holding the wrong kind of value'
local function take(key, v, cost, again)
  local tat = 0
  if v then
    tat = tonumber(v)
    -- tonumber also reads 'nan' and 'inf': a NaN TAT fails every comparison below and would admit every take unwritten.
    if tat == nil or tat ~= tat or tat == math.huge or tat == -math.huge then
      return false, 'ERR hasp: a token bucket key holds a value that is not a number'
    end
  end
  -- How far the TAT lies ahead of now (0: the bucket is full).
  local ahead = tat - now
  if ahead < 0 then ahead = 0 end
  -- Further ahead than a whole burst means the server clock went back (NTP step, failover to a host whose clock is
  -- behind): count the bucket as empty, not as locked for the length of the jump, and let a take write the clamped TAT.
  local stale = ahead > burst
  if stale then ahead = math.floor(burst) end
  local write = 0                       -- how far ahead of now the TAT to write lies; 0: nothing to write
  if commit then
    -- Whole µs per take, at least 1: a tiny cost still costs something.
    local later = ahead + math.ceil(cost * interval)
    if later <= burst then
      write = later
    elseif stale then
      write = ahead
    end
  end
  if write == 0 then
    -- MGET reads a key of another type as no key: a take that writes finds out through NX, this one must ask.
    if not v and redis.call('EXISTS', key) == 1 then return false, wrongType end
    return ahead, 0
  end
  local stored = now + write
  -- %d keeps all digits; Lua's default number format would round them away.
  local value = string.format('%d', stored)
  local second = math.floor(stored / grid)
  if again then
    -- Written before in this command (a hot key): the last take's value goes to Redis once, at the command's end. The
    -- first time, what Redis holds is that earlier value, whose second its expiry is set to.
    if not dirty[key] then
      dirty[key] = math.floor(tonumber(v) / grid)
      dirtyKeys[#dirtyKeys + 1] = key
    end
  elseif v and math.floor(tat / grid) == second then
    redis.call('SET', key, value, 'KEEPTTL')
  else
    local px = expiryAfter(second)
    if not v then
      if not redis.call('SET', key, value, 'PX', px, 'NX') then return false, wrongType end
    else
      redis.call('SET', key, value, 'PX', px)
    end
  end
  written[key] = value
  return ahead, stored
end
`;

// What both forms read first: the bucket's parameters and whether to take, then the server's clock.
const TAKE_PARAMETERS = `
local burst = tonumber(ARGV[1])         -- µs of refill a full bucket holds (capacity × interval, whole)
local interval = tonumber(ARGV[2])      -- µs per token
local commit = ARGV[3] == '1'           -- '1' take, '0' peek
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local written = {}                      -- values this command wrote (or will, at its end), by key
-- Keys whose last value is not in Redis yet: each with the grid second its expiry in Redis is set to, and in order.
local dirty, dirtyKeys = {}, {}
`;

/**
 * Take (or peek at) `cost` tokens: KEYS = [the bucket's TAT], ARGV = [µs of refill a full bucket holds (the burst,
 * `GcraParams.burst`), µs per token, '1' take or '0' peek, cost]. Returns {ahead, stored}: how far (µs) the bucket's
 * TAT lay ahead of the server clock before this call (clamped to a burst), from which `decide` in JavaScript computes
 * the decision with the same arithmetic, and the TAT this take wrote (0 when it wrote nothing), for a REFUND if its
 * caller gave up on it. Two integers rather than the decision's five numbers: each reply element costs the server and
 * the client time.
 *
 * Takes merged into one command from the same bucket parameters run in its batch form, which reads the clock once and
 * every key with one MGET (a command called from Lua costs Redis far more than the work it does), and answers a flat
 * list of both numbers per take; a take that fails there (a key of another type) fails alone.
 */
export const TAKE = new Script(
  `${TAKE_PARAMETERS}${TAKE_FUNCTION}
local ahead, stored = take(KEYS[1], redis.call('MGET', KEYS[1])[1], tonumber(ARGV[4]))
if not ahead then return redis.error_reply(stored) end
return {ahead, stored}
`,
  {
    patient: true, // every caller awaits it; see Script
    sharedClock: true,
    batch: {
      source: `${TAKE_PARAMETERS}${TAKE_FUNCTION}
-- Every key in one MGET, a thousand at a time (unpack is bounded by Lua's stack).
local n = #KEYS
local values = redis.call('MGET', unpack(KEYS, 1, math.min(n, 1000)))
for first = 1001, n, 1000 do
  local part = redis.call('MGET', unpack(KEYS, first, math.min(first + 999, n)))
  for j = 1, #part do values[first + j - 1] = part[j] end
end
local out = {}
for i = 1, n do
  local key = KEYS[i]
  -- A key taken from earlier in this command holds what that take wrote.
  local again = written[key]
  local ok, ahead, stored = pcall(take, key, again or values[i], tonumber(ARGV[3 + i]), again)
  if not ok then
    if type(ahead) ~= 'table' or not ahead.err then ahead = {err = tostring(ahead)} end
    stored = 0
  elseif not ahead then
    ahead = {err = stored}
    stored = 0
  end
  out[2 * i - 1] = ahead
  out[2 * i] = stored
end
-- The last value of every key that later takes of this command left only in \`written\`, keeping the expiry Redis has
-- for it while the TAT is still in that second, as a take does: one SET per hot key and command, not one per take. (A
-- SET on a key this command already wrote cannot meet WRONGTYPE.)
for _, key in ipairs(dirtyKeys) do
  local value = written[key]
  local second = math.floor(tonumber(value) / grid)
  if second == dirty[key] then
    redis.call('SET', key, value, 'KEEPTTL')
  else
    redis.call('SET', key, value, 'PX', expiryAfter(second))
  end
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
local stored = tonumber(ARGV[1])    -- the TAT the lost take stored
local spent = tonumber(ARGV[2])     -- µs it added

if redis.call('GET', key) ~= string.format('%d', stored) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
${EXPIRY_FUNCTION}
local tat = stored - spent
if tat <= now then
  redis.call('DEL', key)
else
  -- The expiry of the earlier TAT's second, set as TAKE sets it (rare enough that keeping the later one buys nothing).
  redis.call('SET', key, string.format('%d', tat), 'PX', expiryAfter(math.floor(tat / grid)))
end
return 1
`);
