// Koa's default error handler removes every response header and sends only err.headers. A limited route must still
// carry its RateLimit fields when a later middleware throws (and a refused one its Retry-After, when a custom handler
// answers by throwing), so for such a request the error handler is wrapped to lend the fields to err.headers for the
// duration of the call (the error object itself is left as it was; its own headers win).
import { POLICY_FIELD, RATELIMIT_FIELD, RETRY_AFTER_FIELD } from '@hasp/core/http';
import type { Context } from 'koa';

const WRAPPED = Symbol('hasp.keepFields');

type Onerror = (this: Context, err: unknown) => void;
type Wrapped = Context & { [WRAPPED]?: true; onerror: Onerror };

/** Makes `ctx.onerror` send the RateLimit fields currently on the response along with the error's own headers. */
export function keepFieldsOnError(ctx: Context): void {
  const c = ctx as Wrapped;
  if (c[WRAPPED]) return;
  c[WRAPPED] = true;
  const original = c.onerror;
  c.onerror = function onerrorWithFields(this: Context, err: unknown): void {
    const policy = this.res.getHeader(POLICY_FIELD);
    const state = this.res.getHeader(RATELIMIT_FIELD);
    const retryAfter = this.res.getHeader(RETRY_AFTER_FIELD);
    const none = policy === undefined && state === undefined && retryAfter === undefined;
    if (err === null || typeof err !== 'object' || this.headerSent || none) return original.call(this, err);
    const e = err as { headers?: unknown };
    const own = Object.prototype.hasOwnProperty.call(e, 'headers');
    const prev = e.headers;
    const lent: Record<string, unknown> = {};
    if (policy !== undefined) lent[POLICY_FIELD] = policy;
    if (state !== undefined) lent[RATELIMIT_FIELD] = state;
    if (retryAfter !== undefined) lent[RETRY_AFTER_FIELD] = retryAfter;
    try {
      e.headers = typeof prev === 'object' && prev !== null ? { ...lent, ...prev } : lent;
    } catch {
      return original.call(this, err); // a frozen error: nothing to lend
    }
    try {
      return original.call(this, err);
    } finally {
      if (own) e.headers = prev;
      else delete e.headers;
    }
  };
}
