// RedisLock: the Locker on one Redis node (or one Cluster).
import { checkPrefix } from '../redis/keys.js';
import type { RedisClient, RedisLockOptions } from '../types.js';
import * as v from '../util/validate.js';
import { BaseLocker, resolveLockerOptions } from './locker.js';
import { RedisLockStore } from './redis-store.js';

const OPTIONS = ['ttl', 'wait', 'onError', 'prefix', 'timeout'] as const;

/** Defaults of the Redis-backed lockers. */
export const REDIS_LOCK_DEFAULTS = { prefix: 'hasp:lock:', timeout: 2_000, driftFactor: 0.01 } as const;

/**
 * A lock on one Redis node or one Redis Cluster. Acquire is one script call (SET-if-absent plus the fence), release and
 * extend compare the token atomically, and waiters are woken by pub/sub when the holder releases.
 *
 * @example
 * ```ts
 * import { Redis } from 'ioredis';
 * import { RedisLock } from '@hasp/core';
 * const locks = new RedisLock(new Redis());
 * await locks.using('order:42', async (lease) => {
 *   // lease.fence grows with every new holder: pass it to the resource you protect
 * });
 * ```
 */
export class RedisLock extends BaseLocker {
  /**
   * @param redis - an ioredis `Redis` or `Cluster`; hasp never changes its configuration
   * @param options - see {@link RedisLockOptions}
   * @throws TypeError or RangeError naming the option when an option is invalid
   */
  constructor(redis: RedisClient, options?: RedisLockOptions) {
    assertClient('redis', redis);
    const o = v.withDefaults(REDIS_LOCK_DEFAULTS, options);
    v.knownKeys('RedisLock', v.definedOnly(options), OPTIONS);
    const base = resolveLockerOptions(o);
    const prefix = checkPrefix(v.string('prefix', o.prefix));
    const timeout = v.duration('timeout', o.timeout);
    super(new RedisLockStore(redis, prefix, timeout, REDIS_LOCK_DEFAULTS.driftFactor), base);
  }
}

/** Checks that `value` looks like an ioredis client, and that hasp's names can work through it. */
export function assertClient(name: string, value: unknown): void {
  const c = value as { evalsha?: unknown; duplicate?: unknown; isCluster?: unknown; options?: { keyPrefix?: unknown } } | null;
  if (typeof c !== 'object' || c === null || typeof c.evalsha !== 'function' || typeof c.duplicate !== 'function') {
    throw new TypeError(`${name} must be an ioredis Redis or Cluster instance, got ${v.describe(value)}`);
  }
  // ioredis puts its keyPrefix in front of hasp's names. On a Cluster, an empty hash tag '{}' opening there makes Redis
  // hash each whole name, so the names of one lock or bucket land in different slots and every script fails
  // (CROSSSLOT). (A complete tag such as 'app{x}:' works: it puts all of hasp's keys in one slot.)
  const keyPrefix = c.options?.keyPrefix;
  if (c.isCluster === true && typeof keyPrefix === 'string') {
    const open = keyPrefix.indexOf('{');
    if (open >= 0 && keyPrefix[open + 1] === '}') {
      throw new TypeError(`${name}'s keyPrefix opens an empty Cluster hash tag '{}', so the keys of one lock or bucket would land in different slots: got ${JSON.stringify(keyPrefix)}`);
    }
  }
}
