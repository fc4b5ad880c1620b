// Redlock: the Locker over N independent Redis masters, sharing leases, waiting and extension with RedisLock.
import { checkPrefix } from '../redis/keys.js';
import type { RedisClient, RedlockOptions } from '../types.js';
import * as v from '../util/validate.js';
import { BaseLocker, resolveLockerOptions } from './locker.js';
import { REDIS_LOCK_DEFAULTS, assertClient, assertLockNames, warnIfSentinelStays } from './redis-lock.js';
import { RedlockStore } from './redlock-store.js';

const OPTIONS = ['ttl', 'wait', 'onError', 'prefix', 'timeout', 'driftFactor', 'quorum', 'nodeTimeout', 'retryCount', 'retryDelay'] as const;

/** Defaults of {@link Redlock} beyond those of {@link RedisLock}. */
export const REDLOCK_DEFAULTS = { retryCount: 2, retryDelay: 50 } as const;

/**
 * The Redlock algorithm over N independent Redis masters: a lock is held when a quorum (default a majority) granted it
 * and its validity (ttl − elapsed − drift) is still positive. Attempts go to all nodes in parallel and settle as soon as
 * the outcome is known; a failed attempt is undone on every node. Fences stay strictly increasing across leases even
 * though the nodes share nothing (see the README's "Fencing tokens"). Callers that wait queue on every node in one
 * order (each stamps its place once and sends it to all), so waiters of different processes take turns.
 *
 * @example
 * ```ts
 * import { Redis } from 'ioredis';
 * import { Redlock } from '@hasp/core';
 * const locks = new Redlock([6379, 6380, 6381, 6382, 6383].map((port) => new Redis(port)));
 * const lease = await locks.acquire('invoice:7', { ttl: 10_000, wait: 2_000 });
 * try { /* ... *\/ } finally { await lease.release(); }
 * ```
 */
export class Redlock extends BaseLocker {
  /** Number of nodes that must agree. */
  readonly quorum: number;

  /**
   * @param clients - ioredis clients of independent masters (not replicas of each other); 1 or more
   * @param options - see {@link RedlockOptions}
   * @throws TypeError or RangeError naming the option when an option is invalid, also for a Cluster client whose
   *   `keyPrefix` with `prefix` opens an empty hash tag `{}` (every lock script would fail `CROSSSLOT`)
   */
  constructor(clients: readonly RedisClient[], options?: RedlockOptions) {
    if (!Array.isArray(clients) || clients.length === 0) {
      throw new TypeError(`clients must be a non-empty array of ioredis clients, got ${v.describe(clients)}`);
    }
    clients.forEach((c, i) => assertClient(`clients[${i}]`, c));
    clients.forEach(warnIfSentinelStays);
    if (new Set(clients).size !== clients.length) throw new RangeError('clients must not contain the same client twice');
    const given = v.definedOnly(options);
    v.knownKeys('Redlock', given, OPTIONS);
    const o = v.withDefaults({ ...REDIS_LOCK_DEFAULTS, ...REDLOCK_DEFAULTS }, given);
    const majority = Math.floor(clients.length / 2) + 1;
    const quorum = o.quorum === undefined ? majority : v.integer('quorum', o.quorum, 1);
    if (quorum < majority || quorum > clients.length) {
      throw new RangeError(
        `quorum must be between ${majority} (a majority of ${clients.length} nodes) and ${clients.length}, got ${quorum}: a smaller quorum lets two holders in`,
      );
    }
    const driftFactor = v.positiveNumber('driftFactor', o.driftFactor, true);
    if (driftFactor >= 1) throw new RangeError(`driftFactor must be below 1, got ${driftFactor}`);
    const base = resolveLockerOptions(o);
    const prefix = checkPrefix(v.string('prefix', o.prefix));
    clients.forEach((c, i) => assertLockNames(`clients[${i}]`, c, prefix));
    super(
      new RedlockStore(clients, {
        prefix,
        timeout: v.duration('timeout', o.timeout),
        nodeTimeout: o.nodeTimeout === undefined ? undefined : v.duration('nodeTimeout', o.nodeTimeout),
        driftFactor,
        quorum,
        retryCount: v.integer('retryCount', o.retryCount, 0),
        retryDelay: v.duration('retryDelay', o.retryDelay, true),
      }),
      base,
    );
    this.quorum = quorum;
  }
}
