// rateLimit() for Express: a token bucket per key, the RateLimit fields on every response, a 429 to next(err) on denial.
import type { Decision } from '@hasp/core';
import { clientIpKey, giveBackTakes, lendRetryAfter, onConnectionClose, RateLimiter } from '@hasp/core/http';
import type { NextFunction, Request, Response } from 'express';
import type { DefaultLocals, DefaultParams, DefaultQuery, RouteMiddleware, RateLimitHandler, RateLimitOptions } from './types.js';

// Express computes req.ip from the socket, or from X-Forwarded-For only as far as `trust proxy` allows.
const ipKey = (req: Request): string => clientIpKey(req.ip);

// Express gives every request its app's prototype (Object.setPrototypeOf), which leaves the request on a map of its own:
// V8 then copies the map and its ~30 property descriptors for each property added to it, about 3 µs for a plain
// `req.rateLimit = d` (of ~50 µs Express spends on a request; measured in-process). So the decision is kept in a
// WeakMap by the request's response (the same object whether the request is read directly or through a Proxy of it)
// and read through an accessor on the prototype that every app of this Express copy shares (the first one up the
// chain without an own `app`), defined once. A request that already has an own `rateLimit` (assigned by the app, or
// by another limiter), one Express did not make, or one whose prototype cannot take the accessor (frozen) gets it
// assigned as before; assigning one (`req.rateLimit = x`) defines an own property, as without it.
const decisions = new WeakMap<object, Decision>();
const accessorOn = new WeakSet<object>();
const accessor: PropertyDescriptor = {
  configurable: true,
  enumerable: false,
  get(this: Request): Decision | undefined {
    return decisions.get(this.res ?? this);
  },
  set(this: Request, value: unknown): void {
    decisions.delete(this.res ?? this);
    Object.defineProperty(this, 'rateLimit', { value, writable: true, enumerable: true, configurable: true });
  },
};

/** Whether `req.rateLimit` reads decisions (the accessor is on its prototype chain, defined here if need be). */
function hasAccessor(req: Request): boolean {
  const proto = Object.getPrototypeOf(req) as object | null;
  if (proto === null) return false;
  if (accessorOn.has(proto)) return true;
  // Only an Express request (its prototype an app's request, with own `app`). The accessor goes on the prototype
  // above every app's own (a mounted app's request has its parent's as prototype), which all apps of this copy share.
  if (!Object.prototype.hasOwnProperty.call(proto, 'app')) return false;
  let target: object | null = proto;
  while (target !== null && Object.prototype.hasOwnProperty.call(target, 'app')) target = Object.getPrototypeOf(target) as object | null;
  if (target === null || target === Object.prototype) return false;
  const own = Object.getOwnPropertyDescriptor(target, 'rateLimit');
  if (own === undefined) {
    try {
      Object.defineProperty(target, 'rateLimit', accessor);
    } catch {
      return false; // frozen or sealed
    }
  } else if (own.get !== accessor.get) return false;
  for (let p: object | null = proto; p !== null && p !== target; p = Object.getPrototypeOf(p) as object | null) {
    if (Object.prototype.hasOwnProperty.call(p, 'rateLimit')) return false;
  }
  accessorOn.add(proto);
  return true;
}

function publish(req: Request, d: Decision): void {
  if (!Object.prototype.hasOwnProperty.call(req, 'rateLimit') && hasAccessor(req)) decisions.set(req.res ?? req, d);
  else req.rateLimit = d;
}

/**
 * Limits requests with a token bucket per key (default: the client IP, IPv6 by /64). Every limited response carries
 * `RateLimit-Policy` and `RateLimit`; a denied request goes to `next(err)` with a 429 (`code: 'RATE_LIMITED'`,
 * `headers` with `Retry-After`), unless `handler` answers it. The decision is at `req.rateLimit`.
 * @throws TypeError or RangeError naming the option when an option is missing or invalid
 * @example
 * ```ts
 * app.post('/sms', rateLimit({ capacity: 3, rate: '3/10min', redis, key: (req) => String(req.body?.phone), policy: 'sms' }), send);
 * ```
 * @typeParam P - route parameters the key, cost and handler functions see, as in Express's `RequestHandler`: give
 *   them (`rateLimit<{ id: string }>({ ..., key: (req) => req.params.id })`) or annotate a function's parameter;
 *   otherwise they see Express's defaults. (The returned middleware takes the route's own types, so the handlers after
 *   it keep theirs.) Likewise `ResBody`, `ReqBody`, `ReqQuery` and `Locals`
 */
/* eslint-disable @typescript-eslint/no-explicit-any -- Express's own defaults for bodies and locals */
export function rateLimit<
  P = DefaultParams,
  ResBody = any,
  ReqBody = any,
  ReqQuery = DefaultQuery,
  Locals extends Record<string, any> = DefaultLocals,
>(options: RateLimitOptions<P, ResBody, ReqBody, ReqQuery, Locals>): RouteMiddleware {
  /* eslint-enable @typescript-eslint/no-explicit-any */
  // Inside, the request types do not matter: the user's functions get the request they were typed for.
  const limiter = new RateLimiter<Request, RateLimitHandler>(options as unknown as RateLimitOptions, ipKey, 'rateLimit');
  const handler = limiter.handler;
  const headers = limiter.headers;

  function decided(req: Request, res: Response, next: NextFunction, d: Decision | undefined): void {
    if (d === undefined) {
      next();
      return;
    }
    publish(req, d);
    try {
      // Skips the fields once the headers went out; should it throw all the same (a response of the app's own making),
      // that must reach next(err), not become an unhandled rejection of the detached promise chain.
      if (headers || !d.allowed) limiter.setHeaders(res, d);
    } catch (error) {
      next(error);
      return;
    }
    if (d.allowed) {
      next();
      return;
    }
    if (handler === undefined) {
      // Refused here: what earlier hasp limiters on this route took for the request goes back first, so the refusal
      // costs nothing in their budgets.
      const back = giveBackTakes(res.locals);
      if (back === undefined) next(limiter.deniedError(d, res));
      else void back.then(() => next(limiter.deniedError(d, res)));
      return;
    }
    answer(handler, req, res, next, d);
  }

  // The handler may answer the request, or let it through (`next()`, `next('route')`, at once or later), in which case
  // it counts in the earlier limiters' budgets. Which it did shows only once the response is over: their takes go back
  // then, if the response was ended (by the handler, or by an error handler after its `next(err)`) and the handler did
  // not let the request through. A response that closes unended (the client went, the connection was destroyed) keeps
  // them: its handler may still pass the request on.
  function answer(h: RateLimitHandler, req: Request, res: Response, next: NextFunction, d: Decision): void {
    let passed = false;
    const onward: NextFunction = (err?: unknown) => {
      if (err === undefined || err === 'route' || err === 'router') passed = true;
      next(err);
    };
    const over = (): void => {
      if (!passed && res.writableEnded) void giveBackTakes(res.locals);
    };
    res.once('close', over);
    // A pipelined response queued behind another never closes if the connection goes before its turn: the
    // connection's close tells then (the takes go back once, whichever comes first).
    if (res.socket == null && req.socket != null) res.once('close', onConnectionClose(req.socket, over));
    let out: unknown;
    try {
      out = h(req, res, onward, d);
    } catch (error) {
      next(error);
      return;
    }
    if (typeof (out as PromiseLike<unknown> | null)?.then === 'function') Promise.resolve(out).catch(next);
  }

  // A plain promise chain rather than an async function: this runs for every request.
  return function rateLimitMiddleware(req: Request, res: Response, next: NextFunction): void {
    // res.locals (Express makes one per request) holds the takes a later limiter may give back.
    void limiter.check(req, res.locals).then(
      (d) => decided(req, res, next, d),
      (error: unknown) => {
        // A 503 under 'closed' carries Retry-After: on the response too, for error pages that send none of err.headers.
        lendRetryAfter(res, error);
        next(error);
      },
    );
  } as RouteMiddleware;
}
