// Lua for the Redis lock backends (RedisLock and each Redlock node). A lock is a hash {t=token, o=owner, n=holds, f=fence}
// at the key stem; the last fence handed out lives in `stem:f`, which outlives the lock so fences keep growing; waiters
// queue in `stem:q` and `stem:d`.
import { Script } from '../redis/script.js';

// Fair hand-off: waiters queue in `stem:q` (token → arrival µs) with a heartbeat deadline in `stem:d`. A free lock goes
// to the first live waiter; a waiter that stops re-attempting for `heartbeat` ms drops out. Redlock nodes skip the queue
// (queue mode ''), since per-node queues could disagree and split every vote.
const FIRST_LIVE = `
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local now = nil
local function firstLive(queueKey, deadlinesKey)
  while true do
    local head = redis.call('ZRANGE', queueKey, 0, 0)[1]
    if not head then return nil end
    now = now or clock()
    if tonumber(redis.call('HGET', deadlinesKey, head) or '0') > now then return head end
    redis.call('ZREM', queueKey, head)
    redis.call('HDEL', deadlinesKey, head)
  end
end
`;

/** Take the lock, re-enter it as the same owner, or report the holder's remaining ms (-1: unknown, a waiter is first). */
export const ACQUIRE = new Script(`
local lockKey = KEYS[1]              -- the lock hash
local fenceKey = KEYS[2]             -- last fence handed out for this key
local queueKey = KEYS[3]             -- waiters: token -> arrival µs
local deadlinesKey = KEYS[4]         -- waiters: token -> heartbeat deadline µs
local token = ARGV[1]                -- the new holder's random token
local ttl = tonumber(ARGV[2])        -- lease time in ms
local owner = ARGV[3]                -- reentrancy owner, '' for none
local floor = ARGV[4]                -- lowest acceptable fence, '' to use the server clock in microseconds
local retention = tonumber(ARGV[5])  -- ms the fence key outlives the lease
local queue = ARGV[6]                -- '' ignore the queue, '0' respect it, '1' respect it and join it when refused
local heartbeat = tonumber(ARGV[7])  -- ms a queued waiter stays queued without re-attempting
${FIRST_LIVE}
local function join()
  if queue ~= '1' then return end
  now = now or clock()
  redis.call('ZADD', queueKey, 'NX', now, token)
  redis.call('HSET', deadlinesKey, token, now + heartbeat * 1000)
  redis.call('PEXPIRE', queueKey, heartbeat)
  redis.call('PEXPIRE', deadlinesKey, heartbeat)
end

local cur = redis.call('HMGET', lockKey, 't', 'o', 'f')
if cur[1] then
  -- The same owner nests; our own token means an earlier attempt of ours already landed here (a retry).
  if (owner ~= '' and cur[2] == owner) or cur[1] == token then
    if cur[1] ~= token then redis.call('HINCRBY', lockKey, 'n', 1) end
    local pttl = redis.call('PTTL', lockKey)
    if pttl < ttl then
      redis.call('PEXPIRE', lockKey, ttl)
      pttl = ttl
    end
    return {1, cur[1], cur[3], pttl}
  end
  join()
  return {0, redis.call('PTTL', lockKey)}
end

if queue ~= '' then
  local head = firstLive(queueKey, deadlinesKey)
  if head and head ~= token then
    join()
    return {0, -1}
  end
  if head then
    redis.call('ZREM', queueKey, token)
    redis.call('HDEL', deadlinesKey, token)
  end
end

local fence
if floor == '' then
  now = now or clock()
  fence = now
else
  fence = tonumber(floor)
end
-- %d keeps all digits; Lua's default number format would round them away. Written and read back in one command: the
-- stored fence is nearly always behind the clock, and only otherwise is it written a second time.
local f = string.format('%d', fence)
local last = tonumber(redis.call('SET', fenceKey, f, 'PX', ttl + retention, 'GET') or '0')
if fence <= last then
  f = string.format('%d', last + 1)
  redis.call('SET', fenceKey, f, 'PX', ttl + retention)
end
redis.call('HSET', lockKey, 't', token, 'o', owner, 'n', 1, 'f', f)
redis.call('PEXPIRE', lockKey, ttl)
return {1, token, f, ttl}
`);

/** Keep the lock at least `ttl` more ms if `token` holds it; the new remaining ms, or -1 when not held. */
export const EXTEND = new Script(`
local lockKey = KEYS[1]          -- the lock hash
local token = ARGV[1]            -- the holder's token
local ttl = tonumber(ARGV[2])    -- minimum ms left afterwards

if redis.call('HGET', lockKey, 't') ~= token then return -1 end
local pttl = redis.call('PTTL', lockKey)
if pttl < ttl then
  redis.call('PEXPIRE', lockKey, ttl)
  pttl = ttl
end
return pttl
`);

/**
 * Drop one hold of `token`; at zero, delete the lock and wake waiters: with a queue, the first live waiter by name (and
 * nobody when none is queued: every waiter queues before it listens); without one (Redlock), everyone (''). 1 when the
 * token held the lock, else 0.
 */
export const RELEASE = new Script(`
local lockKey = KEYS[1]        -- the lock hash
local queueKey = KEYS[2]       -- waiters: token -> arrival µs
local deadlinesKey = KEYS[3]   -- waiters: token -> heartbeat deadline µs
local token = ARGV[1]          -- the holder's token
local channel = ARGV[2]        -- wake-up channel of this key
local queue = ARGV[3]          -- '' when the queue is not used (Redlock)
${FIRST_LIVE}
local cur = redis.call('HMGET', lockKey, 't', 'n')
if cur[1] ~= token then return 0 end
if cur[2] ~= '1' and redis.call('HINCRBY', lockKey, 'n', -1) > 0 then return 1 end
redis.call('DEL', lockKey)
if queue == '' then
  redis.call('PUBLISH', channel, '')
else
  -- A waiter that fell out of the line (no attempt for the heartbeat) is not woken here: it polls and re-attempts.
  local head = firstLive(queueKey, deadlinesKey)
  if head then redis.call('PUBLISH', channel, head) end
end
return 1
`);

/** A waiter gives up: leave the queue, and if it was first while the lock is free, wake the next one. */
export const LEAVE = new Script(`
local lockKey = KEYS[1]        -- the lock hash
local queueKey = KEYS[2]       -- waiters: token -> arrival µs
local deadlinesKey = KEYS[3]   -- waiters: token -> heartbeat deadline µs
local token = ARGV[1]          -- the waiter's token
local channel = ARGV[2]        -- wake-up channel of this key
${FIRST_LIVE}
if redis.call('ZREM', queueKey, token) == 0 then return 0 end
redis.call('HDEL', deadlinesKey, token)
if redis.call('EXISTS', lockKey) == 0 then
  local head = firstLive(queueKey, deadlinesKey)
  if head then redis.call('PUBLISH', channel, head) end
end
return 1
`);

/** Redlock: raise this node's fence to `fence` while `token` holds the lock. 1 when written, 0 when not held. */
export const RAISE_FENCE = new Script(`
local lockKey = KEYS[1]              -- the lock hash
local fenceKey = KEYS[2]             -- last fence handed out for this key
local token = ARGV[1]                -- the holder's token
local fence = ARGV[2]                -- the fence agreed by the quorum
local retention = tonumber(ARGV[3])  -- ms the fence key outlives the lease

if redis.call('HGET', lockKey, 't') ~= token then return 0 end
local last = tonumber(redis.call('GET', fenceKey) or '0')
if tonumber(fence) > last then
  local pttl = redis.call('PTTL', lockKey)
  redis.call('SET', fenceKey, fence, 'PX', pttl + retention)
end
redis.call('HSET', lockKey, 'f', fence)
return 1
`);
