// Public entry point of @hasp/koa: re-exports only.
export { rateLimit } from './rate-limit.js';
export { withLock } from './with-lock.js';
export type { ContextKey, RateLimitHandler, RateLimitOptions, WithLockOptions } from './types.js';
