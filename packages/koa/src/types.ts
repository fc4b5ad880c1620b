// Public types of @hasp/koa: the options of rateLimit() and withLock(), and the ctx.state fields they set.
import type { Decision, Lease } from '@hasp/core';
import type { KeyFunction, RateLimitBaseOptions, WithLockBaseOptions } from '@hasp/core/http';
import type { Context } from 'koa';

/** A custom response for a denied request; the RateLimit fields and Retry-After are already set. */
export type RateLimitHandler = (ctx: Context, decision: Decision) => unknown;

/** A key function: a string, `undefined` (skip), or a promise of either. */
export type ContextKey = KeyFunction<Context>;

/** Options of {@link rateLimit}. */
export interface RateLimitOptions extends RateLimitBaseOptions<Context> {
  /**
   * Answer denied requests yourself instead of throwing a 429.
   * @default none: throws a 429 `http-errors` error, code `RATE_LIMITED`
   */
  handler?: RateLimitHandler;
}

/** Options of {@link withLock}. */
export type WithLockOptions = WithLockBaseOptions;

declare module 'koa' {
  interface DefaultState {
    /** The rate-limit decision of this request (set by `rateLimit()` unless the request was not limited). */
    rateLimit?: Decision;
    /** The lease held for this request (set by `withLock()` while the lock is held). */
    lock?: Lease;
  }
}
