// Public entry point of @hasp/core: re-exports only.
export { HaspError, LockBusyError, LockLostError, LockUnavailableError, RateLimitUnavailableError } from './errors.js';
export type { HaspErrorCode } from './errors.js';
export { MemoryLock } from './lock/memory-lock.js';
export { RedisLock } from './lock/redis-lock.js';
export { Redlock } from './lock/redlock.js';
export { TokenBucket } from './rate-limit/token-bucket.js';
export { parseRate } from './rate-limit/rate.js';
export type {
  AcquireOptions,
  Decision,
  Lease,
  Locker,
  LockErrorEvent,
  LockerOptions,
  MemoryLockOptions,
  RedisClient,
  RedisLockOptions,
  RedlockOptions,
  TokenBucketOptions,
  UsingOptions,
} from './types.js';
