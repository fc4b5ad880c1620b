// The two places a token bucket can live: this process's memory, or Redis (one script call per take).
import { RateLimitUnavailableError } from '../errors.js';
import { bounded } from '../redis/call.js';
import { keyStem, storedKey } from '../redis/keys.js';
import { sendPending, unexpectedReply } from '../redis/script.js';
import type { Decision, RedisClient } from '../types.js';
import { makeRoom } from '../util/bounded.js';
import { realPerfNow, realSetImmediate } from '../util/real-timers.js';
import { REFUND, TAKE } from './bucket.lua.js';
import { decide, type GcraParams } from './gcra.js';

// Where the middleware keeps the admitting takes of one request, newest first, so that a later limiter that refuses the
// request can give them back (see giveBack): in an object that lives as long as the request (Express `res.locals`,
// Koa `ctx.state`), under this key.
const TAKEN = Symbol('hasp.rateLimit.taken');

/** An object of one request's that holds its admitting takes (see `take`'s `home`). */
export type TakeHome = { [TAKEN]?: Taken | undefined };

/** One admitting take: what it stored and where, and the request's take before it. */
export class Taken {
  constructor(
    readonly store: BucketStore,
    readonly key: string,
    readonly cost: number,
    readonly stored: number,
    readonly prev: Taken | undefined,
  ) {}

  /** Takes a request's takes out of its home (so that they are given back once), newest first. */
  static leave(home: TakeHome): Taken | undefined {
    const newest = home[TAKEN];
    if (newest !== undefined) home[TAKEN] = undefined;
    return newest;
  }
}

// Made only for a take that admitted: a denial, often answered from memory, allocates nothing for it.
function record(home: TakeHome, store: BucketStore, key: string, cost: number, stored: number): void {
  home[TAKEN] = new Taken(store, key, cost, stored, home[TAKEN]);
}

export interface BucketStore {
  /** `home`: where to record the take if it admits (see {@link Taken}); only for a take that commits. */
  take(key: string, cost: number, commit: boolean, home?: TakeHome): Promise<Decision>;
  reset(key: string): Promise<void>;
  /**
   * Undoes an admitting take of `cost` that stored `stored`, but only while the bucket still holds exactly that: once
   * another take has built on it, removing its cost could admit more than the bucket allows, so the tokens stay spent.
   * Resolves whether they were given back.
   */
  giveBack(key: string, cost: number, stored: number): Promise<boolean>;
}

export class MemoryBucketStore implements BucketStore {
  private readonly tats = new Map<string, number>();
  // Walks the map a little on every take, dropping buckets that are full again, so memory follows the active keys.
  private sweeper: Iterator<[string, number]> | undefined;

  constructor(
    private readonly params: GcraParams,
    private readonly clock: () => number,
    // An injected clock's check (see validate.clock): a take is refused when it gives no time.
    private readonly checkClock?: () => Error | undefined,
  ) {}

  take(key: string, cost: number, commit: boolean, home?: TakeHome): Promise<Decision> {
    const badClock = this.checkClock?.();
    if (badClock !== undefined) return Promise.reject(badClock);
    const now = Math.round(this.clock() * 1_000);
    this.sweep(now);
    // Stored as Redis names are: a long key (one a client sent, say) takes no more memory than a short one.
    const id = storedKey(key);
    const { decision, store } = decide(this.params, this.tats.get(id), now, cost, commit);
    if (store !== undefined) {
      // Re-insert so the sweeper meets recently used keys last.
      this.tats.delete(id);
      this.tats.set(id, store);
      if (home !== undefined && decision.allowed) record(home, this, key, cost, store);
    }
    return Promise.resolve(decision);
  }

  giveBack(key: string, cost: number, stored: number): Promise<boolean> {
    const id = storedKey(key);
    if (this.tats.get(id) !== stored) return Promise.resolve(false);
    const tat = stored - spentBy(this.params, cost);
    if (tat <= Math.round(this.clock() * 1_000)) this.tats.delete(id);
    else this.tats.set(id, tat);
    return Promise.resolve(true);
  }

  reset(key: string): Promise<void> {
    this.tats.delete(storedKey(key));
    return Promise.resolve();
  }

  /** Buckets currently stored (not yet full again). */
  get size(): number {
    return this.tats.size;
  }

  private sweep(now: number): void {
    for (let i = 0; i < 3; i++) {
      this.sweeper ??= this.tats.entries();
      const next = this.sweeper.next();
      if (next.done) {
        this.sweeper = undefined;
        return;
      }
      if (next.value[1] <= now) this.tats.delete(next.value[0]);
    }
  }
}

/** Most keys a {@link RedisBucketStore} remembers as short of tokens; the oldest entry makes room for a new one. */
export const DENY_CACHE_SIZE = 10_000;
/**
 * Longest time (ms) a {@link RedisBucketStore} answers a key from memory before asking Redis again: a reset made
 * elsewhere (another process, a deleted key) is seen within this time, however long the denial was.
 */
export const DENY_CACHE_MS = 1_000;

/** What is remembered of a bucket known to be short of tokens (µs, monotonic clock). */
interface Short {
  /** When it is full again, counted from when the reply came: never earlier than the real time. */
  tat: number;
  /** Counted from when the take was sent, and earlier by a round trip: decides whether to refuse without Redis. */
  low: number;
  /** When to ask Redis again anyway. */
  until: number;
}

export class RedisBucketStore implements BucketStore {
  // Keys known to be short of tokens, with when their bucket refills on this process's monotonic clock (µs). A take
  // whose cost a lower bound of that time already refuses is answered here without a round trip: it can only deny, and
  // only what Redis would deny too, so the bucket never admits more than it allows. Bounded: oldest write goes first.
  // (Keyed by the bucket's Redis name, whose length is bounded whatever the key's.)
  private readonly denied = new Map<string, Short>();
  // Keys whose bucket changed (a reset, a give-back) while takes may still be on their way, with when (µs, monotonic),
  // oldest first: a reply to a take sent before that describes the bucket as it was, so it is not remembered (it would
  // refuse from memory what Redis now admits). An entry matters only while such a take can still be answered (the call
  // timeout). Bounded like the cache; an entry dropped early leaves its time in `changedBefore`, for every key.
  private readonly changed = new Map<string, number>();
  private changedBefore = -1;
  // Refunds of late takes due at the end of this turn of the event loop (see refund).
  private refunds: { key: string; cost: number; stored: number }[] | undefined;

  private readonly suffix: string;

  constructor(
    private readonly client: RedisClient,
    private readonly prefix: string,
    private readonly params: GcraParams,
    private readonly timeout: number,
    private readonly deniedMax = DENY_CACHE_SIZE,
  ) {
    this.suffix = settingsSuffix(params);
  }

  /** The Redis name of `key`'s bucket (see {@link bucketName}). */
  name(key: string): string {
    return keyStem(this.prefix, key) + this.suffix;
  }

  take(key: string, cost: number, commit: boolean, home?: TakeHome): Promise<Decision> {
    const name = this.name(key);
    if (commit && this.denied.size > 0) {
      const short = this.denied.get(name);
      if (short !== undefined) {
        const now = nowUs();
        if (now < short.until && !decide(this.params, short.low, now, cost, false).decision.allowed) {
          return Promise.resolve(decide(this.params, short.tat, now, cost, false).decision);
        }
        // Expired, or the bound no longer refuses this cost (tokens may be back, or a smaller cost): ask Redis, whose
        // answer replaces the entry.
      }
    }
    return this.remote(key, name, cost, commit, home);
  }

  giveBack(key: string, cost: number, stored: number): Promise<boolean> {
    // Tokens that come back make a remembered shortage wrong: let Redis answer the next take.
    const name = this.name(key);
    this.forget(name);
    return this.call(() => REFUND.run(this.client, [name], [stored, spentBy(this.params, cost)])).then((r) => Number(r) === 1);
  }

  /** The bucket `name` changes now: what memory knows of it, and replies to takes sent before, no longer hold. */
  private forget(name: string): void {
    this.denied.delete(name);
    const now = nowUs();
    const answered = now - this.timeout * 1_000;
    for (const [k, at] of this.changed) {
      if (at >= answered) break;
      this.changed.delete(k);
    }
    this.changed.delete(name);
    if (this.changed.size >= this.deniedMax) {
      const [oldest, at] = this.changed.entries().next().value as [string, number];
      this.changed.delete(oldest);
      this.changedBefore = at;
    }
    this.changed.set(name, now);
  }

  async reset(key: string): Promise<void> {
    const name = this.name(key);
    this.forget(name);
    await this.call(() => {
      // After any take made before it, as the calls were made.
      sendPending(this.client);
      return this.client.del(name);
    });
  }

  /** Keys currently remembered as short of tokens (at most `deniedMax`). */
  get deniedSize(): number {
    return this.denied.size;
  }

  private remote(key: string, name: string, cost: number, commit: boolean, home: TakeHome | undefined): Promise<Decision> {
    const sent = nowUs();
    if (this.denied.size > 0) this.dropExpired(sent);
    // Refunds still due go first: after this take they would find its TAT, and keep their tokens.
    if (this.refunds !== undefined) this.sendRefunds();
    // A plain chain rather than async functions: this runs for every take.
    return this.call(
      () => TAKE.run(this.client, [name], [this.params.burst, this.params.interval, commit ? '1' : '0', cost]),
      // A take that lands after its caller gave up (a stalled server) spent tokens nobody used: give them back while
      // nothing else has touched the bucket since. (A low-rate key, say 3 SMS per 10 minutes, would otherwise lose one.)
      // A peek spends nothing, so it needs no such hook.
      commit ? (late) => this.refund(key, late as TakeReply, cost) : undefined,
    ).then((result) => {
      // Redis read the clock and the bucket; the decision is the same arithmetic on what it saw, done here.
      if (!Array.isArray(result)) throw unavailable(unexpectedReply(result));
      // Number(): a client made with ioredis's `stringNumbers` answers numbers as strings.
      const ahead = Number((result as TakeReply)[0]);
      const { decision, after } = decide(this.params, ahead, 0, cost, false);
      if (home !== undefined && decision.allowed && commit) record(home, this, key, cost, Number((result as TakeReply)[1]));
      // Remember a bucket another take of this cost would find short (after a denial, or a grant that emptied it), and
      // keep a remembered one up to date.
      if (
        commit &&
        (!decision.allowed || decision.remaining < cost || this.denied.has(name)) &&
        sent > (this.changed.get(name) ?? this.changedBefore)
      ) {
        this.remember(name, sent, after);
      }
      return decision;
    });
  }

  private remember(name: string, sent: number, refill: number): void {
    // The server read its clock `refill` µs before the bucket is full again, at some instant between `sent` (when the
    // take was made: it may have waited for the end of the event loop's turn before going out) and now. Counted from
    // now, the refill time is never earlier than the real one, so a local answer's retryAfter and resetAfter are never
    // below what Redis would say: a client that waits them out is admitted. Whether to answer locally at all is decided
    // on the earliest it can be: counted from `sent`, and earlier again by a round trip like this one, since a request
    // that reaches this process later reaches Redis later still.
    const now = nowUs();
    const tat = now + refill;
    const low = sent + refill - (now - sent);
    this.denied.delete(name);
    if (low <= now) return;
    makeRoom(this.denied, this.deniedMax);
    this.denied.set(name, { tat, low, until: now + DENY_CACHE_MS * 1_000 });
  }

  /**
   * Drops the remembered keys whose time is up: they would only be asked of Redis again, and kept, a scan of 10 000
   * client IPs would hold 2 MB per limiter until as many new keys pushed them out. Every entry is written with the same
   * horizon and re-inserted when written, so the map is in `until` order and the expired ones lead: amortised O(1).
   */
  private dropExpired(now: number): void {
    for (const [name, short] of this.denied) {
      if (short.until > now) return;
      this.denied.delete(name);
    }
  }

  /** Gives back the tokens of an admitting take whose caller gave up, while the bucket still holds what it stored. */
  private refund(key: string, reply: TakeReply, cost: number): void {
    const stored = Number(reply[1]);
    // Only a grant spent tokens; a denial stores only when it clamped a TAT from a clock step back.
    if (stored === 0 || !decide(this.params, Number(reply[0]), 0, cost, false).decision.allowed) return;
    // The late replies of one command come back together, oldest first, but only the newest take's TAT is the
    // bucket's: given back in that order, every refund but the last would find another TAT and keep its tokens. Newest
    // first, each leaves the bucket at the TAT of the take before it, whose refund then goes through too.
    if (this.refunds === undefined) {
      this.refunds = [];
      realSetImmediate(() => this.sendRefunds());
    }
    this.refunds.push({ key, cost, stored });
  }

  /** Sends the late takes' refunds that are due, newest first: at the end of the turn, or before a take of this store. */
  private sendRefunds(): void {
    const due = this.refunds;
    if (due === undefined) return;
    this.refunds = undefined;
    for (let i = due.length - 1; i >= 0; i--) {
      const r = due[i]!;
      this.giveBack(r.key, r.cost, r.stored).catch(() => undefined);
    }
  }

  private call<T>(op: () => Promise<T>, late?: (result: T) => void): Promise<T> {
    return bounded(this.client, this.timeout, op, late, undefined, unavailable);
  }
}

/**
 * The Redis name of `key`'s bucket under `prefix`: the key's hash-tagged stem, then its capacity and rate. A bucket
 * stores one number, the time it is full again, which a bucket of other settings would read in its own units: more
 * tokens used than its capacity reads as a clock step back and is written down to empty, giving the other its tokens
 * back; a different rate reads tokens as more or fewer. So buckets share a value only when they share settings, and a
 * change of capacity or rate starts afresh with full buckets.
 */
export function bucketName(prefix: string, key: string, params: GcraParams): string {
  return keyStem(prefix, key) + settingsSuffix(params);
}

// ':' and a 32-bit FNV-1a hash of the settings in base 36 (at most 7 characters): short, since every byte of a name
// costs memory per bucket in Redis. Two settings in use would share a hash once in billions of pairs.
function settingsSuffix(p: GcraParams): string {
  const text = `${p.capacity}/${p.interval}`;
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return `:${(h >>> 0).toString(36)}`;
}

/** The µs a take of `cost` adds to the TAT (the same expression as in TAKE and in `decide`). */
function spentBy(p: GcraParams, cost: number): number {
  return Math.ceil(cost * p.interval);
}

/** TAKE's reply: µs the bucket's TAT lay ahead of the server clock, the TAT it stored (0 for none). */
type TakeReply = [number | string, number | string];

function unavailable(error: unknown): RateLimitUnavailableError {
  return new RateLimitUnavailableError(`token bucket store failed: ${(error as Error).message}`, { cause: error });
}

// Whole microseconds on the monotonic clock: immune to wall-clock steps, the unit of the GCRA arithmetic.
function nowUs(): number {
  return Math.floor(realPerfNow() * 1_000);
}
