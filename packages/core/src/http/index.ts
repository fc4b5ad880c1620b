// @hasp/core/http: what the HTTP adapters (@hasp/express, @hasp/koa) share, so they stay thin and cannot drift apart:
// option resolution, keys, the RateLimit field serializer, HTTP errors, the store-error policy and the lock lifecycle.
// For adapter authors; applications import @hasp/express or @hasp/koa.
export { clientIpKey, parseIPv6, UNKNOWN_CLIENT } from './client-ip.js';
export {
  clientClosedError,
  invalidInputError,
  lendRetryAfter,
  lockBusyError,
  lockUnavailableError,
  rateLimitedError,
  rateLimitUnavailableError,
} from './errors.js';
export type { HttpErrorCode, MiddlewareHttpError } from './errors.js';
export {
  appendListMember,
  POLICY_FIELD,
  RATELIMIT_FIELD,
  RateLimitFields,
  RETRY_AFTER_FIELD,
  retryAfterSeconds,
  sfInteger,
  sfString,
} from './fields.js';
export { callCost, callKey } from './inputs.js';
export type { CostFunction, KeyFunction } from './inputs.js';
export { onConnectionClose } from './connection.js';
export type { Closable } from './connection.js';
export { holdLock, httpLockError, LockGuard, lockerFor, refuseLock, requestOwner } from './lock-guard.js';
export type { ClosableResponse, HeldLock, WithLockBaseOptions } from './lock-guard.js';
export { checkOptionNames, optionErrors } from './options.js';
export { giveBackTakes, MIDDLEWARE_BUCKET_PREFIX, RateLimiter } from './rate-limiter.js';
export type { HeaderTarget, RateLimitBaseOptions, StoreErrorPolicy } from './rate-limiter.js';
export { isStoreError, PROBE_INTERVAL_MS, StoreGuard, storeGuard } from './store-guard.js';
export type { BucketLike, StoreStateEvent } from './store-guard.js';
