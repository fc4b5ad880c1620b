// withLock() for Koa: holds a per-key lock around the rest of the middleware chain, released in finally.
import { LockGuard, refuseLock } from '@hasp/core/http';
import type { Context, DefaultContext, DefaultState, Middleware, Next } from 'koa';
import type { ContextKey, WithLockOptions } from './types.js';

/**
 * Runs the rest of the chain (`await next()`) holding the lock on `key(ctx)`; busy: throws a 423 (`code: 'LOCK_BUSY'`,
 * Retry-After when known); locker unavailable: a 503 (`LOCK_UNAVAILABLE`), and the handler does not run. The lease is
 * at `ctx.state.lock`, auto-extended while `next()` runs and released once in `finally`, also when it throws, before
 * Koa sends the response (a streamed `ctx.body` is read after the release). A client that disconnects does not free
 * the lock while the handler still runs. If `ctx.state.lock.signal` aborts (the lock was lost), stop changing the
 * protected resource. With a wait (`wait`, or a hasp locker's own), a client that disconnects while its request waits
 * for the lock stops the wait (a 499, code `CLIENT_CLOSED_REQUEST`, is thrown).
 * @throws TypeError or RangeError naming the option when an option is missing or invalid
 * @example
 * ```ts
 * router.post('/orders/:id/pay', withLock((ctx) => `order:${ctx.params.id}`, { redis }), pay);
 * ```
 */
export function withLock<StateT = DefaultState, ContextT = DefaultContext>(
  key: ContextKey<StateT, ContextT>,
  options?: WithLockOptions,
): Middleware<StateT, ContextT> {
  // Inside, the context's types do not matter: the key function gets the context it was typed for.
  const guard = new LockGuard<Context>(key as unknown as ContextKey, options, 'withLock');

  const middleware = async function withLockMiddleware(ctx: Context, next: Next): Promise<void> {
    let held;
    try {
      held = await guard.acquire(ctx, ctx, ctx.res);
    } catch (error) {
      // Refused (busy, unavailable, a bad key, the client gone): the request costs nothing in the rate limits before.
      await refuseLock(ctx.state, ctx.res, error);
      throw error;
    }
    if (held === undefined) return next();
    // A withLock further out (another key, or the same one re-entered) gets its own lease back once this one is over:
    // its code after `next()` must not read this released lease's aborted signal, or its fence.
    const outer: unknown = ctx.state.lock;
    ctx.state.lock = held.lease;
    try {
      await next();
    } finally {
      held.release();
      if (outer !== undefined && ctx.state.lock === held.lease) ctx.state.lock = outer as typeof held.lease;
    }
  };
  return middleware as unknown as Middleware<StateT, ContextT>;
}
