// Public types of @hasp/express: the options of rateLimit() and withLock(), and the request fields they set.
import type { Decision, Lease } from '@hasp/core';
import type { KeyFunction, RateLimitBaseOptions, WithLockBaseOptions } from '@hasp/core/http';
import type { NextFunction, Request, Response } from 'express';

/** A custom response for a denied request; the RateLimit fields and Retry-After are already on `res`. */
export type RateLimitHandler = (req: Request, res: Response, next: NextFunction, decision: Decision) => unknown;

/** A key function: a string, `undefined` (skip), or a promise of either. */
export type RequestKey = KeyFunction<Request>;

/** Options of {@link rateLimit}. */
export interface RateLimitOptions extends RateLimitBaseOptions<Request> {
  /**
   * Answer denied requests yourself instead of passing a 429 to `next(err)`.
   * @default none: `next(err)` with a 429 `http-errors` error, code `RATE_LIMITED`
   */
  handler?: RateLimitHandler;
}

/** Options of {@link withLock}. */
export type WithLockOptions = WithLockBaseOptions;

declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace -- Express's documented way to add request fields
  namespace Express {
    interface Request {
      /** The rate-limit decision of this request (set by `rateLimit()` unless the request was not limited). */
      rateLimit?: Decision;
      /** The lease held for this request (set by `withLock()` while the lock is held). */
      lock?: Lease;
    }
  }
}
