// rateLimit() for Koa: a token bucket per key, the RateLimit fields on every response, a thrown 429 on denial.
import type { Decision } from '@hasp/core';
import { clientIpKey, giveBackTakes, lendRetryAfter, RateLimiter } from '@hasp/core/http';
import type { Context, DefaultContext, DefaultState, Middleware, Next } from 'koa';
import { keepFieldsOnError } from './keep-fields.js';
import type { RateLimitHandler, RateLimitOptions } from './types.js';

/** The handler answered the denied request: what it returns means nothing to Koa. */
const ignore = (): void => undefined;

// Koa's ctx.ip is the socket address, or the X-Forwarded-For client only when app.proxy is set.
const ipKey = (ctx: Context): string => clientIpKey(ctx.ip);

/**
 * Limits requests with a token bucket per key (default: the client IP, IPv6 by /64). Every limited response carries
 * `RateLimit-Policy` and `RateLimit` (also when a later middleware throws); a denied request throws a 429
 * (`code: 'RATE_LIMITED'`, `headers` with `Retry-After` and the RateLimit fields), unless `handler` answers it.
 * The decision is at `ctx.state.rateLimit`.
 * @throws TypeError or RangeError naming the option when an option is missing or invalid
 * @example
 * ```ts
 * const phone = (ctx: Koa.Context) => String((ctx.request.body as { phone?: unknown } | undefined)?.phone);
 * router.post('/sms', rateLimit({ capacity: 3, rate: '3/10min', redis, key: phone, policy: 'sms' }), send);
 * ```
 */
export function rateLimit<StateT = DefaultState, ContextT = DefaultContext>(
  options: RateLimitOptions<StateT, ContextT>,
): Middleware<StateT, ContextT> {
  // Inside, the context's types do not matter: the user's functions get the context they were typed for.
  const limiter = new RateLimiter<Context, RateLimitHandler>(options as unknown as RateLimitOptions, ipKey, 'rateLimit');
  const handler = limiter.handler;
  const headers = limiter.headers;

  function refuse(ctx: Context, d: Decision): Promise<void> {
    if (handler === undefined) throw limiter.deniedError(d, ctx.res);
    // A handler may answer by throwing (`ctx.throw(429)`, the Koa way): the error handler must still send the fields.
    keepFieldsOnError(ctx);
    return new Promise<unknown>((resolve) => resolve(handler(ctx, d))).then(ignore);
  }

  // A body stream that fails is reported to ctx.onerror from its 'error' event, after the middleware chain settled.
  function allowedDone(ctx: Context): void {
    const body = ctx.body as { pipe?: unknown } | null | undefined;
    if (typeof body?.pipe === 'function') keepFieldsOnError(ctx);
  }

  // A plain promise chain rather than an async function: this runs for every request.
  const middleware = function rateLimitMiddleware(ctx: Context, next: Next): Promise<void> {
    // ctx.state (Koa makes one per request) holds the takes a later limiter may give back.
    return limiter.check(ctx, ctx.state).then((d): Promise<void> => {
      if (d === undefined) return next();
      ctx.state.rateLimit = d;
      if (headers || !d.allowed) limiter.setHeaders(ctx.res, d);
      if (!d.allowed) {
        // What earlier hasp limiters on this route took for the request goes back first (see giveBackTakes).
        const back = giveBackTakes(ctx.state);
        return back === undefined ? refuse(ctx, d) : back.then(() => refuse(ctx, d));
      }
      if (!headers) return next();
      return next().then(
        () => allowedDone(ctx),
        (error: unknown) => {
          keepFieldsOnError(ctx);
          throw error;
        },
      );
    }, (error: unknown) => {
      // A 503 under 'closed' carries Retry-After: on the response too, for error handlers that send none of err.headers.
      lendRetryAfter(ctx.res, error);
      throw error;
    });
  };
  return middleware as unknown as Middleware<StateT, ContextT>;
}
