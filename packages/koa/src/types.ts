// Public types of @hasp/koa: the options of rateLimit() and withLock(), and the ctx.state fields they set.
import type { Decision, Lease } from '@hasp/core';
import type { KeyFunction, RateLimitBaseOptions, WithLockBaseOptions } from '@hasp/core/http';
import type { DefaultContext, DefaultState, ParameterizedContext } from 'koa';

// The type parameters follow Koa's own (`new Koa<StateT, ContextT>()`): a key function or handler written for the app's
// typed context fits, and the middleware fits that app's `use`.

/** A custom response for a denied request; the RateLimit fields and Retry-After are already set. */
export type RateLimitHandler<StateT = DefaultState, ContextT = DefaultContext> = (
  ctx: ParameterizedContext<StateT, ContextT>,
  decision: Decision,
) => unknown;

/** A key function: a string, `undefined` (skip), or a promise of either. */
export type ContextKey<StateT = DefaultState, ContextT = DefaultContext> = KeyFunction<ParameterizedContext<StateT, ContextT>>;

/** Options of {@link rateLimit}. */
export interface RateLimitOptions<StateT = DefaultState, ContextT = DefaultContext>
  extends RateLimitBaseOptions<ParameterizedContext<StateT, ContextT>> {
  /**
   * Answer denied requests yourself instead of throwing a 429.
   * @default none: throws a 429 `http-errors` error, code `RATE_LIMITED`
   */
  handler?: RateLimitHandler<StateT, ContextT> | undefined;
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
