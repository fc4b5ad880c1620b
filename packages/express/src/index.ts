// Public entry point of @hasp/express: re-exports only.
export { rateLimit } from './rate-limit.js';
export { withLock } from './with-lock.js';
export type { DefaultLocals, DefaultParams, DefaultQuery, RateLimitHandler, RateLimitOptions, RequestKey, RouteMiddleware, WithLockOptions } from './types.js';
