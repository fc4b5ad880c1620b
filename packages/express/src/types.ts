// Public types of @hasp/express: the options of rateLimit() and withLock(), and the request fields they set.
import type { Decision, Lease } from '@hasp/core';
import type { KeyFunction, RateLimitBaseOptions, WithLockBaseOptions } from '@hasp/core/http';
import type { NextFunction, Request, Response } from 'express';

// The type parameters of Express's own RequestHandler, with its defaults, so a route's parameter, body and query types
// flow through the middleware into the key, cost and handler functions and on to the next handler.
/* eslint-disable @typescript-eslint/no-explicit-any -- Express's own defaults for bodies and locals */
/** Express's default route parameters (`ParamsDictionary`). */
export type DefaultParams = Request['params'];
/** Express's default parsed query (`ParsedQs`). */
export type DefaultQuery = Request['query'];
/** Express's default `res.locals`. */
export type DefaultLocals = Record<string, any>;

/**
 * What `rateLimit()` and `withLock()` return: Express middleware generic in the request's types, so in a route it takes
 * the route's own (e.g. `{ id: string }` for `'/orders/:id'`) and the handlers after it keep them. Assignable to
 * Express's `RequestHandler`.
 */
export type RouteMiddleware = <
  P = DefaultParams,
  ResBody = any,
  ReqBody = any,
  ReqQuery = DefaultQuery,
  Locals extends Record<string, any> = DefaultLocals,
>(
  req: Request<P, ResBody, ReqBody, ReqQuery, Locals>,
  res: Response<ResBody, Locals>,
  next: NextFunction,
) => void;

/** A custom response for a denied request; the RateLimit fields and Retry-After are already on `res`. */
export type RateLimitHandler<
  P = DefaultParams,
  ResBody = any,
  ReqBody = any,
  ReqQuery = DefaultQuery,
  Locals extends Record<string, any> = DefaultLocals,
> = (
  req: Request<P, ResBody, ReqBody, ReqQuery, Locals>,
  res: Response<ResBody, Locals>,
  next: NextFunction,
  decision: Decision,
) => unknown;

/** A key function: a string, `undefined` (skip), or a promise of either. */
export type RequestKey<
  P = DefaultParams,
  ResBody = any,
  ReqBody = any,
  ReqQuery = DefaultQuery,
  Locals extends Record<string, any> = DefaultLocals,
> = KeyFunction<Request<P, ResBody, ReqBody, ReqQuery, Locals>>;

/** Options of {@link rateLimit}. */
export interface RateLimitOptions<
  P = DefaultParams,
  ResBody = any,
  ReqBody = any,
  ReqQuery = DefaultQuery,
  Locals extends Record<string, any> = DefaultLocals,
> extends RateLimitBaseOptions<Request<P, ResBody, ReqBody, ReqQuery, Locals>> {
  /**
   * Answer denied requests yourself instead of passing a 429 to `next(err)`.
   * @default none: `next(err)` with a 429 `http-errors` error, code `RATE_LIMITED`
   */
  handler?: RateLimitHandler<P, ResBody, ReqBody, ReqQuery, Locals> | undefined;
}
/* eslint-enable @typescript-eslint/no-explicit-any */

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
