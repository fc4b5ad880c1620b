// Public entry point of @hasp/core: re-exports only.
export { HaspError, LockBusyError, LockLostError, LockUnavailableError, RateLimitUnavailableError } from './errors.js';
export type { HaspErrorCode } from './errors.js';
export { MemoryLock } from './lock/memory-lock.js';
export { RedisLock } from './lock/redis-lock.js';
export { Redlock } from './lock/redlock.js';
export { TokenBucket } from './rate-limit/token-bucket.js';
export { parseRate } from './rate-limit/rate.js';
// The types of rateLimit's options that the adapters take from here: for applications, which need not import the
// adapter authors' entry point (@hasp/core/http) for them.
export type { StoreErrorPolicy } from './http/rate-limiter.js';
export type { StoreStateEvent } from './http/store-guard.js';
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
