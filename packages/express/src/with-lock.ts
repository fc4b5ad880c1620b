// withLock() for Express: holds a per-key lock while the request is handled, released when the response is ended.
import { LockGuard, refuseLock, type HeldLock } from '@hasp/core/http';
import type { NextFunction, Request, Response } from 'express';
import { releaseOnEnd } from './release-on-end.js';
import type { DefaultLocals, DefaultParams, DefaultQuery, RouteMiddleware, RequestKey, WithLockOptions } from './types.js';

/**
 * Runs the rest of the route holding the lock on `key(req)`; busy: `next(err)` with a 423 (`code: 'LOCK_BUSY'`,
 * Retry-After when known); locker unavailable: a 503 (`LOCK_UNAVAILABLE`), and the handler does not run. The lease is
 * at `req.lock` and is auto-extended until the response is ended (by the handler, an error handler, or Express's final
 * handler, also for Express 5's rejected async handlers), then released once, before the response is sent.
 *
 * A response destroyed by code of this process (`res.destroy()`, a failed `pipeline` into it) while its connection is
 * open frees the lock at once. A client that disconnects, a socket timeout, or a connection closed under the response
 * (Express answering an error after the headers were sent, `closeAllConnections()`, a client's `CONNECT`) does not: the
 * handler still holds the lock until it ends the response (`res.end()` works on a closed connection, so handlers that
 * always answer need nothing special, also behind a later middleware that wraps `res.end()`, such as `compression()`,
 * where the lock then covers the delivery it holds back).
 * A handler that gives up on a gone client without ending the response frees the lock when the response object is
 * garbage-collected, which an idle Node process does within seconds to tens of seconds and a busy one may not do for
 * minutes; end the response to free it at once. A middleware that answers while the handler still runs (a timeout
 * middleware) ends the lock with its answer. If `req.lock.signal` aborts (the lock was lost, or released so), stop
 * changing the protected resource. With a wait (`wait`, or a hasp locker's own), a client that disconnects while its
 * request waits for the lock stops the wait (a 499, code `CLIENT_CLOSED_REQUEST`, goes to `next(err)`). Express 4
 * ignores rejected promises: there, an async handler must pass its errors to `next` itself, or the rejection is
 * unhandled (by Node's default the process ends, and a Redis lock stays until its ttl) and its response is never ended.
 * @throws TypeError or RangeError naming the option when an option is missing or invalid
 * @example
 * ```ts
 * app.post('/orders/:id/pay', withLock((req) => `order:${req.params.id}`, { redis }), pay);
 * ```
 * @typeParam P - route parameters the key function sees, as in Express's `RequestHandler`: give them
 *   (``withLock<{ id: string }>((req) => `order:${req.params.id}`)``) or annotate the function's parameter; otherwise
 *   it sees Express's defaults. (The returned middleware takes the route's own types, so the handlers after it keep
 *   `req.params.id: string` either way.) Likewise `ResBody`, `ReqBody`, `ReqQuery` and `Locals`
 */
/* eslint-disable @typescript-eslint/no-explicit-any -- Express's own defaults for bodies and locals */
export function withLock<
  P = DefaultParams,
  ResBody = any,
  ReqBody = any,
  ReqQuery = DefaultQuery,
  Locals extends Record<string, any> = DefaultLocals,
>(key: RequestKey<P, ResBody, ReqBody, ReqQuery, Locals>, options?: WithLockOptions): RouteMiddleware {
  /* eslint-enable @typescript-eslint/no-explicit-any */
  const guard = new LockGuard<Request>(key as unknown as RequestKey, options, 'withLock');

  async function lock(req: Request, res: Response, next: NextFunction): Promise<void> {
    let held: HeldLock | undefined;
    try {
      held = await guard.acquire(req, req, res);
    } catch (error) {
      // Refused (busy, unavailable, a bad key, the client gone): the request costs nothing in the rate limits before.
      await refuseLock(res.locals, res, error);
      next(error);
      return;
    }
    if (held === undefined) {
      next();
      return;
    }
    if (res.writableEnded) {
      // Someone answered while we waited for the lock (e.g. a timeout middleware): there is nothing left to protect.
      held.release();
      return;
    }
    req.lock = held.lease;
    releaseOnEnd(res, held);
    next();
  }

  return function withLockMiddleware(req: Request, res: Response, next: NextFunction): void {
    void lock(req, res, next);
  } as RouteMiddleware;
}
