// Lua for the Redis token bucket: the same GCRA rules as gcra.ts, with time read from the Redis server.
import { Script } from '../redis/script.js';

/**
 * Take (or peek at) `cost` tokens. Returns {allowed 0|1, remaining, retryAfter ms, resetAfter ms}.
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
local base = tat
if base < now then base = now end
local burst = capacity * interval
-- Whole µs per take, at least 1: ceil(base + tiny) would round to base and make tiny costs free.
local newTat = base + math.ceil(cost * interval)
local allowed = newTat - now <= burst
local after = base
if allowed then
  after = newTat
  if commit then
    -- %d keeps all digits; Lua's default number format would round them away.
    redis.call('SET', key, string.format('%d', newTat), 'PX', math.ceil((newTat - now) / 1000))
  end
end
local remaining = math.floor((burst - (after - now)) / interval)
local retryAfter = 0
if not allowed then retryAfter = math.ceil((newTat - burst - now) / 1000) end
return {allowed and 1 or 0, remaining, retryAfter, math.ceil((after - now) / 1000)}
`);
