// MemoryLock: the Locker for one process, with no Redis; the zero-setup default of the middleware.
import { checkPrefix } from '../redis/keys.js';
import type { MemoryLockOptions } from '../types.js';
import { monotonicNow } from '../util/clock.js';
import * as v from '../util/validate.js';
import { BaseLocker, resolveLockerOptions } from './locker.js';
import { MemoryLockStore } from './memory-store.js';

const OPTIONS = ['ttl', 'wait', 'onError', 'prefix', 'clock'] as const;

/**
 * A lock held in this process's memory. Same semantics as {@link RedisLock} (fences, reentrancy, waiting with
 * immediate wake-up, auto-extension), for code that runs in one process or for tests.
 *
 * @example
 * ```ts
 * import { MemoryLock } from '@hasp/core';
 * const locks = new MemoryLock();
 * const lease = await locks.acquire('report', { wait: 5_000 });
 * try { /* ... *\/ } finally { await lease.release(); }
 * ```
 */
export class MemoryLock extends BaseLocker {
  /**
   * @param options - see {@link MemoryLockOptions}
   * @throws TypeError or RangeError naming the option when an option is invalid
   */
  constructor(options?: MemoryLockOptions) {
    const o = v.definedOnly(options);
    v.knownKeys('MemoryLock', o, OPTIONS);
    // Checked as the Redis lockers check it, so code that moves to Redis meets no new error there.
    if (o.prefix !== undefined) checkPrefix(v.string('prefix', o.prefix));
    const clock = o.clock === undefined ? undefined : v.clock('clock', o.clock);
    super(new MemoryLockStore(clock?.now ?? monotonicNow, clock?.check), resolveLockerOptions(o));
  }
}
