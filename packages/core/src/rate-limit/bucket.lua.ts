// Lua for the Redis token bucket: the same GCRA rules as gcra.ts, with time read from the Redis server.
import { Script } from '../redis/script.js';

/**
 * Take (or peek at) `cost` tokens. Returns {allowed 0|1, remaining, retryAfter ms, resetAfter ms, resetAfter µs, stored}:
 * the resetAfter µs, unrounded, lets the caller remember exactly when the bucket refills; `stored` is the TAT this take
 * wrote ('' when it wrote nothing), for a REFUND if its caller gave up on it.
 * The key holds the TAT in µs and expires when the bucket is full again, so a full bucket leaves no key.
 */
export const TAKE = new Script(`
local key = KEYS[1]                     -- the bucket's TAT, µs
local capacity = tonumber(ARGV[1])      -- tokens
local interval = tonumber(ARGV[2])      -- µs per token
local cost = tonumber(ARGV[3])          -- tokens wanted
local commit = ARGV[4] == '1'           -- '1' take, '0' peek

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', key) or '0')
local burst = capacity * interval
local base = tat
if base < now then base = now end
-- A TAT beyond now + burst means the server clock went back (NTP step, failover to a host whose clock is behind):
-- count the bucket as empty, not as locked for the length of the jump, and let a take write the clamped TAT down.
local stale = base > now + burst
if stale then base = math.floor(now + burst) end
-- Whole µs per take, at least 1: ceil(base + tiny) would round to base and make tiny costs free.
local newTat = base + math.ceil(cost * interval)
local allowed = newTat - now <= burst
local after = base
local store = nil
if allowed then
  after = newTat
  store = newTat
elseif stale then
  store = base
end
if commit and store then
  -- %d keeps all digits; Lua's default number format would round them away. The key expires when the bucket is full.
  redis.call('SET', key, string.format('%d', store), 'PX', math.ceil((store - now) / 1000))
end
local remaining = math.floor((burst - (after - now)) / interval)
local retryAfter = 0
if not allowed then retryAfter = math.ceil((newTat - burst - now) / 1000) end
local stored = ''
if commit and store then stored = string.format('%d', store) end
return {allowed and 1 or 0, remaining, retryAfter, math.ceil((after - now) / 1000), after - now, stored}
`, true); // patient: every caller awaits it (see Script)

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
