// RedisLock: the Locker on one Redis node (or one Cluster).
import { checkPrefix } from '../redis/keys.js';
import type { RedisClient, RedisLockOptions } from '../types.js';
import * as v from '../util/validate.js';
import { BaseLocker, resolveLockerOptions } from './locker.js';
import { RedisLockStore } from './redis-store.js';
import { warnOnce } from '../util/warn.js';

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
   * @throws TypeError or RangeError naming the option when an option is invalid, also for a Cluster client whose
   *   `keyPrefix` with `prefix` opens an empty hash tag `{}` (every lock script would fail `CROSSSLOT`)
   */
  constructor(redis: RedisClient, options?: RedisLockOptions) {
    assertClient('redis', redis);
    const o = v.withDefaults(REDIS_LOCK_DEFAULTS, options);
    v.knownKeys('RedisLock', v.definedOnly(options), OPTIONS);
    const base = resolveLockerOptions(o);
    const prefix = checkPrefix(v.string('prefix', o.prefix));
    assertLockNames('redis', redis, prefix);
    warnIfSentinelStays(redis);
    const timeout = v.duration('timeout', o.timeout);
    super(new RedisLockStore(redis, prefix, timeout, REDIS_LOCK_DEFAULTS.driftFactor), base);
  }
}

/** Checks that `value` looks like an ioredis client. */
export function assertClient(name: string, value: unknown): void {
  const c = value as { evalsha?: unknown; duplicate?: unknown } | null;
  if (typeof c !== 'object' || c === null || typeof c.evalsha !== 'function' || typeof c.duplicate !== 'function') {
    // A string here is most likely a connection URL, password and all: not echoed in any form.
    const got = typeof value === 'string' ? 'a string (for a URL, pass new Redis(url))' : v.describe(value);
    throw new TypeError(`${name} must be an ioredis Redis or Cluster instance, got ${got}`);
  }
}

/**
 * Warns once per process when a locker is made on an ioredis Sentinel client without `failoverDetector`: such a
 * client keeps its connection to a master Sentinel has demoted until Sentinel reconfigures it (about 10 s after a
 * `SENTINEL FAILOVER`, measured), and that master goes on granting locks beside the new one. A warning, not an error:
 * the option is the client's, and a deployment may have its reasons.
 */
export function warnIfSentinelStays(client: unknown): void {
  const o = (client as { options?: { sentinels?: unknown; failoverDetector?: unknown } }).options;
  if (!Array.isArray(o?.sentinels) || o.sentinels.length === 0 || Boolean(o.failoverDetector)) return;
  warnOnce(
    'HASP_SENTINEL_FAILOVER_DETECTOR',
    'hasp: a lock on an ioredis Sentinel client without failoverDetector: true. After a failover the client stays on the demoted master, which grants locks beside the new one until Sentinel reconfigures it (about 10 s): make the client with failoverDetector: true (see "Sentinel" in the @hasp/core README)',
  );
}

/**
 * Checks that the names of one lock share a Cluster slot through `client`: ioredis puts its keyPrefix in front of hasp's
 * `prefix`, and an empty hash tag '{}' opening there makes Redis hash each whole name, so the names of one lock land in
 * different slots and every script fails (CROSSSLOT). (A complete tag such as 'app{x}:' works: every key in one slot.)
 */
export function assertLockNames(name: string, client: unknown, prefix: string): void {
  const c = client as { isCluster?: unknown; options?: { keyPrefix?: unknown } };
  if (c.isCluster !== true) return;
  const names = (typeof c.options?.keyPrefix === 'string' ? c.options.keyPrefix : '') + prefix;
  const open = names.indexOf('{');
  if (open >= 0 && names[open + 1] === '}') {
    throw new TypeError(
      `${name}'s keyPrefix and prefix open an empty Cluster hash tag '{}', so the keys of one lock would land in different slots: got ${JSON.stringify(names)}`,
    );
  }
}
