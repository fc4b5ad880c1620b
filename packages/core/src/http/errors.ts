// The http-errors the middleware hands to the app's error handling: 429, 423, 503, and the 500 for a bad key or cost.
import createError, { type HttpError } from 'http-errors';
import type { Decision } from '../types.js';
import { RETRY_AFTER_FIELD } from './fields.js';

/** Codes carried by the HTTP errors of the middleware (`err.code`). */
export type HttpErrorCode =
  | 'RATE_LIMITED'
  | 'RATE_LIMIT_UNAVAILABLE'
  | 'LOCK_BUSY'
  | 'LOCK_UNAVAILABLE'
  | 'INVALID_KEY'
  | 'INVALID_COST'
  | 'CLIENT_CLOSED_REQUEST';

/** An `http-errors` error as the middleware makes it: `status`, `expose`, `code`, and the `headers` to send. */
export type MiddlewareHttpError = HttpError & {
  code: HttpErrorCode;
  headers?: Record<string, string>;
  /** The refused decision (429 only). */
  decision?: Decision;
};

/**
 * The 429's class. To code that looks at it, an instance is what `createError(429, …)` makes: its prototype chain
 * runs through `createError.TooManyRequests` (so `status`, `statusCode`, `HttpError` and `Error` come from there),
 * `constructor` is `createError.TooManyRequests`, `name` is `TooManyRequestsError` and `message` is an own enumerable
 * property. http-errors instead switches the prototype of a plain Error after making it, which V8 handles slowly: on a
 * flooded route, making each 429 took 1.76 µs that way and 0.27 µs this way.
 */
const TooManyRequests = createError.TooManyRequests;
class RateLimited extends Error {
  declare expose: boolean;
  declare code: 'RATE_LIMITED';
  declare headers: Record<string, string>;
  declare decision: Decision;

  constructor(message: string, headers: Record<string, string>, decision: Decision) {
    super(message);
    Object.defineProperty(this, 'message', { value: message, enumerable: true, configurable: true, writable: true });
    this.expose = true;
    this.code = 'RATE_LIMITED';
    this.headers = headers;
    this.decision = decision;
  }
}
Object.setPrototypeOf(RateLimited.prototype, TooManyRequests.prototype);
Object.defineProperty(RateLimited.prototype, 'constructor', { value: TooManyRequests, configurable: true, writable: true });
Object.defineProperty(RateLimited.prototype, 'name', { value: 'TooManyRequestsError', configurable: true, writable: true });

/**
 * 429, code `RATE_LIMITED`, exposed, with `headers` (Retry-After and, when enabled, the RateLimit fields). Made without
 * a stack trace: a refusal is not a bug, and capturing one per denied request cost a flooded server about a tenth of its
 * CPU. Still an `http-errors` `HttpError` (`instanceof createError.HttpError`), as `createError(429, …)` would make it.
 */
export function rateLimitedError(decision: Decision, headers: Record<string, string>): MiddlewareHttpError {
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    return new RateLimited('Too many requests: rate limit exceeded', headers, decision) as unknown as MiddlewareHttpError;
  } finally {
    Error.stackTraceLimit = limit;
  }
}

/** 503, code `RATE_LIMIT_UNAVAILABLE`: the rate-limit store failed and `onStoreError` is `'closed'`. */
export function rateLimitUnavailableError(retryAfter: number, cause: unknown): MiddlewareHttpError {
  return createError(503, 'Rate limit temporarily unavailable', {
    expose: true,
    code: 'RATE_LIMIT_UNAVAILABLE',
    headers: { 'Retry-After': String(retryAfter) },
    cause,
  }) as MiddlewareHttpError;
}

/** 423, code `LOCK_BUSY`, with Retry-After (whole seconds, rounded up) when the holder's remaining time is known. */
export function lockBusyError(retryAfter: number | undefined, cause: unknown): MiddlewareHttpError {
  return createError(423, 'Locked: the resource is being changed by another request', {
    expose: true,
    code: 'LOCK_BUSY',
    headers: retryAfter === undefined ? {} : { 'Retry-After': String(retryAfter) },
    cause,
  }) as MiddlewareHttpError;
}

/** 503, code `LOCK_UNAVAILABLE`: the locker could not answer; the handler did not run. */
export function lockUnavailableError(cause: unknown): MiddlewareHttpError {
  return createError(503, 'Lock service temporarily unavailable', {
    expose: true,
    code: 'LOCK_UNAVAILABLE',
    cause,
  }) as MiddlewareHttpError;
}

/**
 * 499 (nginx's "client closed request"), code `CLIENT_CLOSED_REQUEST`: the client went away while its request waited for
 * a busy lock, so it stopped waiting; the handler did not run. Nobody can read the answer: it is for the app's logs.
 */
export function clientClosedError(): MiddlewareHttpError {
  return createError(499, 'Client closed the request while it waited for the lock', {
    expose: false,
    code: 'CLIENT_CLOSED_REQUEST',
  }) as MiddlewareHttpError;
}

/** 500 (not exposed) for a key or cost function that threw or returned something unusable. Nothing was written. */
export function invalidInputError(code: 'INVALID_KEY' | 'INVALID_COST', message: string, cause?: unknown): MiddlewareHttpError {
  return createError(500, message, {
    expose: false,
    code,
    ...(cause === undefined ? {} : { cause }),
  }) as MiddlewareHttpError;
}

/**
 * Puts the error's `Retry-After` on the response too, as a 429's is: an error page that sends none of `err.headers`
 * (most render HTML, and NestJS's exception layer) still tells the client when to come back.
 */
export function lendRetryAfter(res: { readonly headersSent?: boolean; setHeader(name: string, value: string): unknown }, error: unknown): void {
  const value = (error as { headers?: Record<string, unknown> } | null)?.headers?.[RETRY_AFTER_FIELD];
  if (typeof value === 'string' && res.headersSent !== true) res.setHeader(RETRY_AFTER_FIELD, value);
}
