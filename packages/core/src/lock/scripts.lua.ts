// Lua for the Redis lock backends (RedisLock and each Redlock node). A lock is one string at the key stem,
// "<token> <fence> <holds> <waiters> <owner>" (owner last: it may contain anything), so a free key is taken by a single
// SET NX PX and freed by GET + DEL; a hash costs two more calls per cycle, and each call inside a script costs about as
// much as the script call itself. `holds` is '1' for a lock without an owner (its one hold); with an owner, its holds,
// comma-separated, each `<id>:<deadline>`: each acquire that takes or re-enters it adds its own, named by the first
// HOLD_ID_LENGTH characters of the token it was sent with, and each release removes its own. A command run twice
// (ioredis sends again, after a reconnect, what was sent but not answered; a Cluster client, what failed with
// "Connection is closed") then changes nothing the second time, where a count would gain or lose a hold nobody has: a
// second holder, or a lock held for its ttl by nobody. Each hold ends at its own deadline (this server's clock, ms),
// which its lease's extensions push out, and the key lives until the latest: a hold that is never released (its
// process crashed) ends with its lease, though the owner's other holds come and go, where one shared expiry would keep
// it for as long as they kept coming. `waiters` is 1 once someone was refused while it was held: only then does a
// release look for somebody to wake. The last fence handed out lives in `stem:f`, which outlives the lock so fences keep
// growing; waiters queue in `stem:q` and `stem:d`.
import { Script } from '../redis/script.js';

/** Characters of an acquire's token that name its hold of a lock with an owner (48 bits of a random token). */
export const HOLD_ID_LENGTH = 8;

/** The id of the hold an acquire sent with `token` adds to a lock with an owner; '' for a lock without one. */
export function holdId(token: string, owner: string): string {
  return owner === '' ? '' : token.slice(0, HOLD_ID_LENGTH);
}

/**
 * RELEASE's arguments without an heir: the token, and when given, the name the holder kept in the line (Redlock), its
 * hold's id (a lock with an owner), a lock token whose holds stay (`spare`), and the tokens it may hold under (`cover`):
 * see RELEASE. Only as many as are given go out: every argument costs on every call.
 */
export function releaseArgs(token: string, hold = '', leaving = '', spare = '', cover = ''): string[] {
  if (cover !== '') return [token, '', '', '', leaving, hold, spare, cover];
  if (spare !== '') return [token, '', '', '', leaving, hold, spare];
  return hold === '' && leaving === '' ? [token] : [token, '', '', '', leaving, hold];
}

/** EXTEND's arguments: the token and ttl, and when given, the hold's id and the cover (see EXTEND). */
export function extendArgs(token: string, ttl: number, hold = '', cover = ''): (string | number)[] {
  if (cover !== '') return [token, ttl, hold, cover];
  return hold === '' ? [token, ttl] : [token, ttl, hold];
}

/** Upper bound on one sleep of a waiter between attempts (ms): covers a lost wake-up message. */
export const MAX_POLL_MS = 1_000;

/** How long a fence key outlives its lock, in ms; see "Fencing tokens" in the README. */
export const FENCE_RETENTION_MS = 3_600_000;

/** The acquire script renews a fence key's expiry once per this many µs of fences (see ACQUIRE). */
export const FENCE_RENEW_US = 60_000_000;

/** A refused waiter is told the tokens ahead of it in the line when there are at most this many (see TRANSFER). */
export const AHEAD_MAX = 16;

/** How many lapsed places at the head of a line one script call clears at most (see FIRST_LIVE). */
export const FIRST_LIVE_SWEEP = 1_000;

/**
 * Ms a queued waiter stays in line without re-attempting. Waiters re-attempt at least every second (the polling
 * fallback), so only a waiter that crashed or went away drops out, after at most this long.
 */
export const QUEUE_HEARTBEAT_MS = 3_000;

/**
 * Ms the waiters ahead of a caller keep their places once the lock is free and that caller asks for it. A live waiter
 * asks at least every second (the polling fallback), which renews its place, and the first one asks at once when a
 * release wakes it; one that has not asked within this long has most likely gone, and its leave never came (its node
 * was down then, say), so it stops holding the line up well before its heartbeat would run out.
 */
export const FREE_HEAD_GRACE_MS = 1_500;

/**
 * Redlock's line is kept on every node, and a node that was down when a waiter left (or was let in and released)
 * keeps that waiter's place until it lapses; restarted from its append-only file, it brings back places long gone.
 * So its waiters ask more often (every {@link REDLOCK_POLL_MS} at least), and places lapse sooner.
 */
export const REDLOCK_POLL_MS = 250;
/** Redlock's {@link QUEUE_HEARTBEAT_MS}. */
export const REDLOCK_HEARTBEAT_MS = 1_500;
/** Redlock's {@link FREE_HEAD_GRACE_MS}. */
export const REDLOCK_GRACE_MS = 1_000;

// Constants are part of the scripts' source rather than arguments: every argument costs the client and the server a
// little on every call. A lock's wake-up channel is its name plus ':w' (lockNames), so it is not sent either.
const CONSTANTS = `
local retention = ${FENCE_RETENTION_MS}  -- ms the fence key outlives the lease
local aheadMax = ${AHEAD_MAX}  -- a refused waiter is told who is ahead of it in line when at most this many are
local renewUs = ${FENCE_RENEW_US}  -- µs: a fence in a new one of these renews the fence key's expiry
local heartbeat = ${QUEUE_HEARTBEAT_MS}  -- ms a queued waiter stays queued without re-attempting
local grace = ${FREE_HEAD_GRACE_MS}  -- ms those ahead keep their places once the lock is free and someone behind asks
`;

// `kept(holds, ms, id)` reads a lock's holds (with an owner) at this server's time `ms`: those that have not ended, less
// the one named `id`, comma-separated ('' when none); the latest deadline among them (0 when none); and `id`'s own
// deadline, or nil when it is not among them. A hold without a deadline (written by an earlier version of these
// scripts) lasts as long as the key: its deadline reads as math.huge.
const KEPT = `
local function kept(holds, ms, id)
  local out, last, own = {}, 0, nil
  for h in string.gmatch(holds, '[^,]+') do
    local hid, d = string.match(h, '^([^:]+):?(%d*)$')
    d = tonumber(d) or math.huge
    if hid == id then
      own = d
    elseif d > ms then
      out[#out + 1] = h
      if d > last then last = d end
    end
  end
  return table.concat(out, ','), last, own
end
-- Writes the lock (t, f, w, o) with \`holds\`, to live until the latest of them: \`last\`, that of the holds it kept, and
-- \`d\`, that of the one it adds (0 for none). A hold without a deadline (last: math.huge) keeps the key's ttl, at least d.
local function writeHolds(t, f, holds, w, o, last, d, ms)
  local value = t .. ' ' .. f .. ' ' .. holds .. ' ' .. w .. ' ' .. o
  if last ~= math.huge then
    redis.call('SET', lockKey, value, 'PX', math.max(last, d) - ms)
  elseif d > 0 then
    redis.call('SET', lockKey, value, 'PX', math.max(redis.call('PTTL', lockKey), d - ms))
  else
    redis.call('SET', lockKey, value, 'XX', 'KEEPTTL')
  end
end
-- The holds \`rest\` with hold \`id\` ending at \`d\` added.
local function withHold(rest, id, d)
  local hold = id .. ':' .. string.format('%d', d)
  if rest == '' then return hold end
  return rest .. ',' .. hold
end
`;

// Lua: whether the lock token \`t\` is one of the space-separated tokens in \`cover\` (see RELEASE).
const IN_COVER = "string.find(' ' .. cover .. ' ', ' ' .. t .. ' ', 1, true)";

// A new lock's holds: its one hold, with an owner named by the id of the acquire that took it and ending with its ttl
// (see the top). Needs clock().
const HOLDS = `${KEPT}
local function msNow()
  now = now or clock()
  return math.floor(now / 1000)
end
local function firstHold(t, o, ttl)
  if o == '' then return '1' end
  return string.sub(t, 1, ${HOLD_ID_LENGTH}) .. ':' .. string.format('%d', msNow() + ttl)
end
`;

// Fair hand-off: waiters queue in `stem:q` (name → place) with a heartbeat deadline in `stem:d`. A free lock goes to
// the first live waiter; a waiter that stops re-attempting for `heartbeat` ms drops out. On RedisLock a waiter's name
// is its token and its place the server's clock at arrival. Redlock waiters bring both (a name that outlives each round's
// token, a place stamped once by the client), so every node orders them alike; lines that disagree anyway (a waiter
// missing from a node it could not reach) are put right by that waiter's next attempt, which joins where it is missing.
// Every script declares `local now = nil` (server µs, read once) before including these; the hot paths run before
// them, since defining them costs time too.
const FIRST_LIVE = `
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
${HOLDS}local function parse(v)
  return string.match(v, '^(%S+) (%d+) (%S+) (%d) (.*)$')
end
local function record(t, f, n, w, o)
  return t .. ' ' .. f .. ' ' .. n .. ' ' .. w .. ' ' .. o
end
-- The lock at lockKey was just written for (t, o) with fence f: record f as the last fence, or (when the stored one is
-- not below it: a clock step back, or a Redlock floor behind this node) hand out the next one instead. %d keeps all
-- digits; Lua's default number format would round them away.
local function fenced(lockKey, fenceKey, t, o, f, ttl, retention, waiters)
  local last = tonumber(redis.call('SET', fenceKey, f, 'PX', ttl + retention, 'GET') or '0')
  if tonumber(f) <= last then
    f = string.format('%d', last + 1)
    redis.call('SET', fenceKey, f, 'PX', ttl + retention)
    redis.call('SET', lockKey, record(t, f, firstHold(t, o, ttl), waiters, o), 'XX', 'KEEPTTL')
  end
  return f
end
-- At most ${FIRST_LIVE_SWEEP} lapsed places are cleared per call: a crashed process's thousands of waiters would
-- otherwise block Redis for the whole sweep (about 4 ms per 1,000). Past that, the next lapsed place stands for the
-- head (and the second value says so): it holds the line up, lets nobody in out of turn, and later calls clear the rest.
local function firstLive(queueKey, deadlinesKey)
  for _ = 1, ${FIRST_LIVE_SWEEP} do
    local head = redis.call('ZRANGE', queueKey, 0, 0)[1]
    if not head then return nil end
    now = now or clock()
    if tonumber(redis.call('HGET', deadlinesKey, head) or '0') > now then return head end
    redis.call('ZREM', queueKey, head)
    redis.call('HDEL', deadlinesKey, head)
  end
  return redis.call('ZRANGE', queueKey, 0, 0)[1], true
end
`;

// Wakes the first live waiter of a lock found free (a release that freed it may hand it over instead, and does its own).
// After FIRST_LIVE; needs \`queueKey\`, \`deadlinesKey\` and \`channel\`.
// Every PUBLISH is a pcall: a user without the channel's permission (a new Redis 7 ACL user has none) must not fail
// the script after it freed the lock; the waiter polls instead.
const WAKE_FIRST = `
local function wakeFirst()
  local head = firstLive(queueKey, deadlinesKey)
  if head then redis.pcall('PUBLISH', channel, head) end
end
`;

/** Take the lock, re-enter it as the same owner, or report the holder's remaining ms (-1: unknown, a waiter is first). */
export const ACQUIRE = new Script(`
local lockKey = KEYS[1]              -- the lock
local fenceKey = KEYS[2]             -- last fence handed out for this key
local queueKey = KEYS[3]             -- waiters: name -> place
local deadlinesKey = KEYS[4]         -- waiters: name -> heartbeat deadline µs
local token = ARGV[1]                -- the new holder's random token
local ttl = tonumber(ARGV[2])        -- lease time in ms
local owner = ARGV[3]                -- reentrancy owner, '' for none
local floor = ARGV[4]                -- lowest acceptable fence, '' to use the server clock in microseconds
local queue = ARGV[5] or ''          -- '' (or none) ignore the queue (then its two names may be left out), '0' respect
                                     -- it, '1' respect it and join it when refused
-- Redlock names its waiter apart from the round's fresh token, and stamps its place in line itself, the same on every
-- node, so that all nodes order their lines alike (see RedlockStore.attempt). Without them: the token, and arrival by
-- this server's clock.
local member = ARGV[6] or token      -- the waiter's name in the line
local place = ARGV[7]                -- its place in the line (client µs), or none
${CONSTANTS}local now = nil
if place then
  heartbeat = ${REDLOCK_HEARTBEAT_MS}
  grace = ${REDLOCK_GRACE_MS}
end

-- Nobody in line: the lock is ours if the key is free, in one command. (The common case, so it comes before any helper
-- is defined.) %d keeps all digits, which Lua's default number format would round away.
if queue == '' or redis.call('EXISTS', queueKey) == 0 then
  -- RedisLock proposes the server clock in µs, concatenated from TIME's two strings (a third of what converting them
  -- to a number and formatting it costs); Redlock sends the floor the client chose for all its nodes.
  local f = floor
  local t
  if f == '' then
    t = redis.call('TIME')
    f = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  end
  -- A lock with an owner holds by this acquire's hold, which ends with its ttl (see the top).
  local holds = '1'
  if owner ~= '' then
    t = t or redis.call('TIME')
    local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    holds = string.sub(token, 1, ${HOLD_ID_LENGTH}) .. ':' .. string.format('%d', ms + ttl)
  end
  if redis.call('SET', lockKey, token .. ' ' .. f .. ' ' .. holds .. ' 0 ' .. owner, 'NX', 'PX', ttl) then
    -- KEEPTTL costs half of PX, so the fence key's expiry is renewed only when the fence enters a new minute, with a
    -- minute to spare: the key outlives the last lease (of this ttl) by at least retention.
    local last = redis.call('SET', fenceKey, f, 'KEEPTTL', 'GET')
    local n = tonumber(f)
    last = tonumber(last or '0')
    if n > last then
      if math.floor(n / renewUs) ~= math.floor(last / renewUs) then
        redis.call('PEXPIRE', fenceKey, ttl + retention + renewUs / 1000)
      end
      return {1, token, f, ttl}
    end
    -- The stored fence is not below ours (a clock step back, or a Redlock floor behind this node): the next one.
    f = string.format('%d', last + 1)
    redis.call('SET', fenceKey, f, 'PX', ttl + retention + renewUs / 1000)
    redis.call('SET', lockKey, token .. ' ' .. f .. ' ' .. holds .. ' 0 ' .. owner, 'XX', 'KEEPTTL')
    return {1, token, f, ttl}
  end
end
${FIRST_LIVE}
local joinRank = nil  -- this waiter's rank in the line, when join() found it there already
local function join()
  if queue ~= '1' then return end
  now = now or clock()
  -- A place ahead of this server's clock (its client's clock is fast) counts as now: waiters of a process whose clock
  -- runs ahead would otherwise queue behind everyone who arrives until real time catches up with their places.
  local at = now
  if place then
    if tonumber(place) < now then at = place end
    redis.call('ZADD', queueKey, 'NX', at, member)
  else
    -- Already in line (a re-attempt): its place stays, and refused() reads the rank found here.
    joinRank = redis.call('ZRANK', queueKey, member)
    if not joinRank then
      -- Waiters that join in one merged command read one clock (sharedClock): each after the last keeps the order of
      -- their calls, which their process's own line has (tied places would sort by token, and a release there would
      -- name as heir one that Redis does not have first).
      local last = redis.call('ZRANGE', queueKey, -1, -1, 'WITHSCORES')[2]
      if last and tonumber(last) >= at then at = tonumber(last) + 1 end
      redis.call('ZADD', queueKey, 'NX', at, member)
    end
  end
  redis.call('HSET', deadlinesKey, member, now + heartbeat * 1000)
  redis.call('PEXPIRE', queueKey, heartbeat)
  redis.call('PEXPIRE', deadlinesKey, heartbeat)
end

-- A refusal, with who refused (the holder's token, or the line's first waiter). A queued waiter of a single node
-- instead learns who is ahead of it in the line (when few are), so that a release in its own process can tell once it
-- is first, and let it in at once (see TRANSFER).
local function refused(pttl, holder)
  if queue ~= '1' or place then return {0, pttl, holder} end
  local rank = joinRank or redis.call('ZRANK', queueKey, token)
  if not rank or rank > aheadMax then return {0, pttl} end
  if rank == 0 then return {0, pttl, {}} end
  return {0, pttl, redis.call('ZRANGE', queueKey, 0, rank - 1)}
end

local function proposal()
  if floor ~= '' then return floor end
  now = now or clock()
  return string.format('%d', now)
end

local function granted(f, waiters)
  return {1, token, fenced(lockKey, fenceKey, token, owner, f, ttl, retention, waiters), ttl}
end

local cur = redis.call('GET', lockKey)
if cur then
  local t, f, n, w, o = parse(cur)
  -- The same owner nests; our own token means an earlier attempt of ours already landed here (a retry). So does our
  -- own hold among the holds: this very command ran before (sent again after a reconnect), and added it then.
  if (owner ~= '' and o == owner) or t == token then
    if owner == '' then
      local pttl = redis.call('PTTL', lockKey)
      if pttl < ttl then
        redis.call('PEXPIRE', lockKey, ttl)
        pttl = ttl
      end
      return {1, t, f, pttl}
    end
    -- Our hold, for ttl from now (one added before by this very command is replaced), beside the others that have not
    -- ended; the key lives until the latest of them.
    local ms = msNow()
    local id = string.sub(token, 1, ${HOLD_ID_LENGTH})
    local rest, last = kept(n, ms, id)
    writeHolds(t, f, withHold(rest, id, ms + ttl), w, o, last, ms + ttl, ms)
    return {1, t, f, ttl}
  end
  join()
  -- Whoever waits in line must hear the release.
  if w == '0' and queue == '1' then redis.call('SET', lockKey, record(t, f, n, 1, o), 'XX', 'KEEPTTL') end
  return refused(redis.call('PTTL', lockKey), t)
end

-- Free, with a line: the first live waiter's turn.
local head, standIn = firstLive(queueKey, deadlinesKey)
if head and head ~= member then
  -- Those ahead of us have grace ms to show up (one that has gone stops holding the line up sooner than its
  -- heartbeat would let it); live ones refresh their place with their next attempt.
  local due = now + grace * 1000
  for _, name in ipairs(redis.call('ZRANGE', queueKey, 0, aheadMax - 1)) do
    if name == member then break end
    if tonumber(redis.call('HGET', deadlinesKey, name) or '0') > due then redis.call('HSET', deadlinesKey, name, due) end
  end
  join()
  -- A lapsed place standing in: nobody will release or wake, so the caller asks again at once (each call clears more).
  return refused(standIn and 0 or -1, head)
end
local waiters = 0
if head then
  if place then
    -- A Redlock waiter keeps its place until its release (or it would lose it wherever a round it lost granted it), but
    -- no longer than the lock: should its holder vanish, the line moves on when the lock expires.
    redis.call('HSET', deadlinesKey, member, now + math.min(heartbeat, ttl) * 1000)
  else
    redis.call('ZREM', queueKey, member)
    redis.call('HDEL', deadlinesKey, member)
  end
  if redis.call('ZCARD', queueKey) > 0 then waiters = 1 end
end
local f = proposal()
redis.call('SET', lockKey, record(token, f, firstHold(token, owner, ttl), waiters, owner), 'PX', ttl)
return granted(f, waiters)
`, { patient: true, sharedClock: true }); // every caller awaits it (see Script)

/**
 * Keep the lock at least `ttl` more ms if `token` holds it (with an owner: the hold named `hold`, which must not have
 * ended); the new remaining ms (of that hold), or -1 when not held.
 */
export const EXTEND = new Script(`
local lockKey = KEYS[1]          -- the lock
local token = ARGV[1]            -- the holder's token
local ttl = tonumber(ARGV[2])    -- minimum ms left afterwards
local hold = ARGV[3] or ''       -- the hold's id, for a lock with an owner, or ''
local cover = ARGV[4]            -- tokens Redis may still hold the lock under for this lease (see RELEASE), or none

local cur = redis.call('GET', lockKey)
if cur and cover then
  local t = string.match(cur, '^(%S+) ')
  if t and ${IN_COVER} then token, hold = t, '' end
end
if not cur or string.sub(cur, 1, #token + 1) ~= token .. ' ' then return -1 end
if hold == '' then
  local pttl = redis.call('PTTL', lockKey)
  if pttl < ttl then
    redis.call('PEXPIRE', lockKey, ttl)
    pttl = ttl
  end
  return pttl
end
${KEPT}
local t, f, n, w, o = string.match(cur, '^(%S+) (%d+) (%S+) (%d) (.*)$')
local tm = redis.call('TIME')
local ms = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local rest, last, own = kept(n, ms, hold)
-- Ended (its deadline passed) or released: the lease is over, though the owner's other holds keep the lock.
if not own or own <= ms then return -1 end
local d = ms + ttl
if own > d and own < math.huge then d = own end
writeHolds(t, f, withHold(rest, hold, d), w, o, last, d, ms)
return d - ms
`);

/**
 * Drop one hold of `token` (of a lock with an owner: the hold named `hold`, whichever token it was asked under); at
 * zero, delete the lock and, if anyone was refused meanwhile, pass it on. With a queue the
 * first live waiter gets it: when that is `heir` (a waiter in the releasing process), the lock is handed to it right
 * here and the reply is {1, fence}, saving the waiter a wake-up and a round trip; otherwise the waiter is woken by
 * name (nobody when none is queued: every waiter queues before it listens). 1 when the token held the lock, else 0;
 * 2 when it was freed and someone was refused meanwhile but the line's names were not given (then call WAKE).
 */
export const RELEASE = new Script(`
local lockKey = KEYS[1]              -- the lock
local queueKey = KEYS[2]             -- waiters: name -> place (may be left out, see above)
local deadlinesKey = KEYS[3]         -- waiters: name -> heartbeat deadline µs
local fenceKey = KEYS[4]             -- last fence handed out (only with heir)
local token = ARGV[1]                -- the holder's token
local heir = ARGV[2] or ''           -- token of a local waiter to hand the lock to if it is first in line, or ''
local heirTtl = tonumber(ARGV[3])    -- its lease time in ms
local heirOwner = ARGV[4]            -- its reentrancy owner
local leaving = ARGV[5] or ''        -- Redlock: the holder's name in the line, kept there while it held, or ''
local hold = ARGV[6] or ''           -- the hold's id, for a lock with an owner, or ''
-- Redlock's undo of a nested round that won, on nodes that have not answered: the hold goes unless it is in the lock
-- the round re-entered (this token's), where it is the new lease's.
local spare = ARGV[7]
-- RedisLock: an heir let in by a hand-over within its process (see TRANSFER) holds under the releasing lease's token
-- until Redis records the hand-over, and for good when Redis refused to (a replica's READONLY, MISCONF); along a chain
-- of such hand-overs, under any of the tokens before it. Those are its cover (space-separated): found under one, the
-- lock is released as the heir's, and the heir leaves the line the hand-over took it out of.
local cover = ARGV[8]
local channel = lockKey .. ':w'      -- wake-up channel of this key
${CONSTANTS}local now = nil

-- The common case first, before any helper is defined: our only hold, nobody refused meanwhile.
local cur = redis.call('GET', lockKey)
if cur and cover then
  local t = string.match(cur, '^(%S+) ')
  if t and ${IN_COVER} then
    if queueKey then
      redis.call('ZREM', queueKey, token)
      redis.call('HDEL', deadlinesKey, token)
    end
    token, hold = t, ''
  end
end
local f, n, w, shorter
if hold == '' then
  if cur and string.find(cur, token .. ' ', 1, true) == 1 then f, n, w = string.match(cur, '^(%d+) (%S+) (%d) ', #token + 2) end
elseif cur then
  -- By its id: gone already (this release ran before, and was sent again), or ended (its lease is over: left for the
  -- next call to drop), it drops nothing. Holds that have ended go with it, so the lock is freed once none is left that
  -- has not ('more': others stay, the key until the latest).
  local t, hf, holds, hw, o = string.match(cur, '^(%S+) (%d+) (%S+) (%d) (.*)$')
  if t == spare then
    holds = nil
  elseif holds and not string.find(holds, ',', 1, true) and string.sub(holds, 1, #hold + 1) == hold .. ':' then
    -- Ours alone: it has not ended, since the key lives until it does.
    n, w = '1', hw
  elseif holds then
    ${KEPT}
    local tm = redis.call('TIME')
    now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
    local ms = math.floor(now / 1000)
    local rest, last, own = kept(holds, ms, hold)
    if own and own <= ms then
      own = nil
    end
    if own and rest == '' then
      n, w = '1', hw
    elseif own then
      writeHolds(t, hf, rest, hw, o, last, 0, ms)
      -- Ours was the latest: the key now ends sooner, which a waiter asleep until its old end must hear (below), when
      -- that is before its next attempt anyway (woken sooner, it would only be refused again: nested leases of one
      -- owner come and go far more often).
      n, w, shorter = 'more', hw, own > last and last - ms < ${MAX_POLL_MS}
    end
  end
end
if leaving == '' then
  if not n then return 0 end
  if n == '1' then
    redis.call('DEL', lockKey)
    if w == '0' then return 1 end
    -- Freed with someone refused meanwhile, but called without the line's names (Redlock, for whom sending them on
    -- every release costs more than this rare second call): the caller sends WAKE.
    if not queueKey then return 2 end
  end
end
${FIRST_LIVE}${WAKE_FIRST}
if leaving ~= '' then
  -- Out of the line on every node, also where this lease did not hold the lock: there it may have been first.
  redis.call('ZREM', queueKey, leaving)
  redis.call('HDEL', deadlinesKey, leaving)
  if not n then
    if not cur then wakeFirst() end
    return 0
  end
  if n == '1' then redis.call('DEL', lockKey) end
end
if n ~= '1' then
  if shorter and w == '1' and queueKey then wakeFirst() end
  -- A count (a lock written by an earlier version of these scripts, whose releases send no hold id): one less.
  local c = n ~= 'more' and tonumber(n)
  if c then
    local t, f, _, w, o = parse(cur)
    redis.call('SET', lockKey, record(t, f, c - 1, w, o), 'XX', 'KEEPTTL')
  end
  return 1
end
-- A waiter that fell out of the line (no attempt for the heartbeat) is not woken here: it polls and re-attempts.
local head = firstLive(queueKey, deadlinesKey)
if not head then return 1 end
if head ~= heir then
  redis.pcall('PUBLISH', channel, head)
  return 1
end
redis.call('ZREM', queueKey, heir)
redis.call('HDEL', deadlinesKey, heir)
local waiters = 0
if redis.call('ZCARD', queueKey) > 0 then waiters = 1 end
local nf = string.format('%d', now)
redis.call('SET', lockKey, record(heir, nf, firstHold(heir, heirOwner, heirTtl), waiters, heirOwner), 'PX', heirTtl)
return {1, fenced(lockKey, fenceKey, heir, heirOwner, nf, heirTtl, retention, waiters)}
`, { sharedClock: true });

/**
 * Hand the lock from `from` to `to`, a waiter that the releasing process has already let in with fence `fence` (one
 * above the lock's) because it knew `to` was first in line: see "Hand-offs within a process" in the README. `from` held
 * it without nesting (no owner) when the release was sent; this only records the hand-over, so it must not let anyone
 * else in. Idempotent: 1 once `to` holds the lock (now for `ttl` ms); 0 when `from` no longer held it (its lease had
 * ended, so `to` was never covered by it and gets nothing); -1 when `from` held it but the fence key has moved past
 * `fence` (nothing in hasp does that while a lease holds), so the lock was freed instead.
 */
export const TRANSFER = new Script(`
local lockKey = KEYS[1]              -- the lock
local queueKey = KEYS[2]             -- waiters: name -> place
local deadlinesKey = KEYS[3]         -- waiters: name -> heartbeat deadline µs
local fenceKey = KEYS[4]             -- last fence handed out
local from = ARGV[1]                 -- the releasing holder's token
local to = ARGV[2]                   -- the waiter let in
local fence = ARGV[3]                -- its fence
local ttl = tonumber(ARGV[4])        -- its lease time in ms
local owner = ARGV[5]                -- its reentrancy owner
local cover = ARGV[6]                -- the releasing holder's own cover (it was let in this way too: see RELEASE), or none
local channel = lockKey .. ':w'      -- wake-up channel of this key
${CONSTANTS}local now = nil
${FIRST_LIVE}${WAKE_FIRST}
local cur = redis.call('GET', lockKey)
local t, f, n, w, o
if cur then t, f, n, w, o = parse(cur) end
if t == to then return 1 end
redis.call('ZREM', queueKey, to)
redis.call('HDEL', deadlinesKey, to)
if t ~= from and not (cover and t and ${IN_COVER}) then
  if not cur then wakeFirst() end
  return 0
end
-- Nested (a count of holds from an earlier version of these scripts): not the only hold after all, so only this one is
-- dropped, as a release would. (\`from\` has no owner, so its lock has no hold ids.)
if n ~= '1' then
  local c = tonumber(n)
  if c then redis.call('SET', lockKey, record(t, f, c - 1, w, o), 'XX', 'KEEPTTL') end
  return -1
end
if tonumber(redis.call('GET', fenceKey) or '0') >= tonumber(fence) then
  redis.call('DEL', lockKey)
  wakeFirst()
  return -1
end
local waiters = 0
if redis.call('ZCARD', queueKey) > 0 then waiters = 1 end
redis.call('SET', lockKey, record(to, fence, firstHold(to, owner, ttl), waiters, owner), 'PX', ttl)
redis.call('SET', fenceKey, fence, 'PX', ttl + retention + renewUs / 1000)
return 1
`, { sharedClock: true });

/**
 * LEAVE's second argument for a waiter that leaves the line only, whatever the lock: a late refusal of an attempt whose
 * call has given up proves the token did not hold the lock then, and a release of this process may have handed it the
 * lock since, for a lease that is live.
 */
export const LINE_ONLY = 'line';

/**
 * A waiter gives up: leave the queue, and if it was first while the lock is free, wake the next one. A lock handed to
 * it meanwhile (RELEASE's `heir`) is freed and passed on, unless ARGV[2] is {@link LINE_ONLY}.
 */
export const LEAVE = new Script(`
local lockKey = KEYS[1]        -- the lock
local queueKey = KEYS[2]       -- waiters: name -> place
local deadlinesKey = KEYS[3]   -- waiters: name -> heartbeat deadline µs
local token = ARGV[1]          -- the waiter's token
local lineOnly = ARGV[2] == '${LINE_ONLY}'  -- leave the line, and never the lock (see LINE_ONLY)
local channel = lockKey .. ':w'  -- wake-up channel of this key
local now = nil
${FIRST_LIVE}${WAKE_FIRST}
-- A release in our process may have handed us the lock while we were giving up: pass it on.
local cur = not lineOnly and redis.call('GET', lockKey)
if cur then
  local t, f, n, w, o = parse(cur)
  if t == token then
    -- With an owner, others of it may have re-entered since: only this waiter's own hold goes (with those that ended).
    local rest, last, own = '', 0, o == ''
    if o ~= '' then rest, last, own = kept(n, msNow(), string.sub(token, 1, ${HOLD_ID_LENGTH})) end
    if own and rest ~= '' then
      writeHolds(t, f, rest, w, o, last, 0, msNow())
      -- Ours was the latest: the key ends sooner now, which the first waiter, asleep until the old end, must hear
      -- (when before its next attempt: see RELEASE).
      if own > last and last - msNow() < ${MAX_POLL_MS} and w == '1' then wakeFirst() end
    elseif own then
      redis.call('DEL', lockKey)
      wakeFirst()
    end
    redis.call('ZREM', queueKey, token)
    redis.call('HDEL', deadlinesKey, token)
    return 1
  end
end
if redis.call('ZREM', queueKey, token) == 0 then return 0 end
redis.call('HDEL', deadlinesKey, token)
if redis.call('EXISTS', lockKey) == 0 then wakeFirst() end
return 1
`, { sharedClock: true });

/** Redlock: wake the first live waiter in line if the lock is free (after a RELEASE that answered 2). */
export const WAKE = new Script(`
local lockKey = KEYS[1]        -- the lock
local queueKey = KEYS[2]       -- waiters: name -> place
local deadlinesKey = KEYS[3]   -- waiters: name -> heartbeat deadline µs
local channel = lockKey .. ':w'  -- wake-up channel of this key
local now = nil
${FIRST_LIVE}${WAKE_FIRST}
if redis.call('EXISTS', lockKey) == 0 then wakeFirst() end
return 1
`);

/** Redlock: raise this node's fence to `fence` while `token` holds the lock. 1 when written, 0 when not held. */
export const RAISE_FENCE = new Script(`
local lockKey = KEYS[1]              -- the lock
local fenceKey = KEYS[2]             -- last fence handed out for this key
local token = ARGV[1]                -- the holder's token
local fence = ARGV[2]                -- the fence agreed by the quorum
${CONSTANTS}local now = nil
${FIRST_LIVE}
local cur = redis.call('GET', lockKey)
if not cur then return 0 end
local t, f, n, w, o = parse(cur)
if t ~= token then return 0 end
local last = tonumber(redis.call('GET', fenceKey) or '0')
if tonumber(fence) > last then
  local pttl = redis.call('PTTL', lockKey)
  redis.call('SET', fenceKey, fence, 'PX', pttl + retention)
end
redis.call('SET', lockKey, record(t, fence, n, w, o), 'XX', 'KEEPTTL')
return 1
`);

/**
 * Redlock: put a live lease's lock back on a node that lost it (restarted empty, say), so that a lease kept by extension
 * keeps a majority while nodes restart one after another. Where the key is free, as one hold, with the lease's fence;
 * the node's fence key is raised to it if below. Where the key holds the lease's own lock without the lease's hold (a
 * lease of the same owner put it back first: nested leases share the token), the hold is added. Someone else's lock
 * (a stray grant) is left alone. 1 when restored.
 */
export const RESTORE = new Script(`
local lockKey = KEYS[1]              -- the lock
local fenceKey = KEYS[2]             -- last fence handed out for this key
local token = ARGV[1]                -- the lease's token
local ttl = tonumber(ARGV[2])        -- ms to hold it for
local fence = ARGV[3]                -- the lease's fence
local owner = ARGV[4]                -- the lease's reentrancy owner, '' for none
local id = ARGV[5] or ''             -- its hold's id (with an owner), or ''
${CONSTANTS}${KEPT}
local hold, ms = '1', 0
if id ~= '' then
  local tm = redis.call('TIME')
  ms = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
  hold = id .. ':' .. string.format('%d', ms + ttl)
end
if not redis.call('SET', lockKey, token .. ' ' .. fence .. ' ' .. hold .. ' 0 ' .. owner, 'NX', 'PX', ttl) then
  if id == '' then return 0 end
  local cur = redis.call('GET', lockKey)
  local t, f, n, w, o = string.match(cur or '', '^(%S+) (%d+) (%S+) (%d) (.*)$')
  if t ~= token or o ~= owner then return 0 end
  local rest, last, own = kept(n, ms, id)
  -- Ours and live: nothing to do. Ours and ended (this node missed the lease's extensions): replaced, as if missing.
  if own and own > ms then return 0 end
  writeHolds(t, f, withHold(rest, id, ms + ttl), w, o, last, ms + ttl, ms)
  return 1
end
if tonumber(redis.call('GET', fenceKey) or '0') < tonumber(fence) then
  redis.call('SET', fenceKey, fence, 'PX', ttl + retention + renewUs / 1000)
end
return 1
`);
