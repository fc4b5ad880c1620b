// The 429 of rateLimit as an http-errors error: same shape as every other HttpError, made without a stack trace.
import { createRequire } from 'node:module';
import { inspect } from 'node:util';
import { describe, expect, it } from 'vitest';
import { rateLimitedError } from '../../packages/core/src/http/errors.js';

// The copy of http-errors core itself resolves, so instanceof compares against the same class.
const createError = createRequire(new URL('../../packages/core/package.json', import.meta.url))('http-errors') as {
  (status: number, message: string, props?: object): Error;
  HttpError: abstract new () => Error;
  TooManyRequests: abstract new () => Error;
  isHttpError(value: unknown): boolean;
};

describe('rateLimitedError', () => {
  const decision = { allowed: false, limit: 3, remaining: 0, retryAfter: 1_500, resetAfter: 4_500 };

  it('is an http-errors 429 (HttpError, status, expose, code, headers, decision), with no stack frames', () => {
    const err = rateLimitedError(decision, { 'Retry-After': '2' });
    expect(err).toBeInstanceOf(createError.HttpError);
    expect(err).toBeInstanceOf(Error);
    expect(createError.isHttpError(err)).toBe(true);
    expect(err).toMatchObject({ status: 429, statusCode: 429, expose: true, code: 'RATE_LIMITED', headers: { 'Retry-After': '2' }, decision });
    expect(err.name).toBe('TooManyRequestsError');
    expect(err.message).toBe('Too many requests: rate limit exceeded');
    expect(String(err.stack)).not.toMatch(/\n\s+at /);
  });

  it('looks like the 429 http-errors itself makes: class, constructor, own keys, inherited status, printed form', () => {
    const err = rateLimitedError(decision, { 'Retry-After': '2' });
    // Also without a stack trace, so that the printed forms compare.
    const limit = Error.stackTraceLimit;
    Error.stackTraceLimit = 0;
    const theirs = createError(429, 'Too many requests: rate limit exceeded', { expose: true, code: 'RATE_LIMITED', headers: { 'Retry-After': '2' }, decision });
    Error.stackTraceLimit = limit;
    expect(err).toBeInstanceOf(createError.TooManyRequests);
    expect(err.constructor).toBe(theirs.constructor);
    expect(Object.keys(err)).toEqual(Object.keys(theirs));
    expect(Object.hasOwn(err, 'status')).toBe(Object.hasOwn(theirs, 'status'));
    expect(String(err)).toBe(String(theirs));
    expect(inspect(err)).toBe(inspect(theirs));
    expect(JSON.stringify(err)).toBe(JSON.stringify(theirs));
  });

  it('leaves Error.stackTraceLimit as it was, also for other errors made afterwards', () => {
    const before = Error.stackTraceLimit;
    rateLimitedError(decision, {});
    expect(Error.stackTraceLimit).toBe(before);
    expect(String(new Error('x').stack)).toMatch(/\n\s+at /);
    expect(String(createError(423, 'busy').stack)).toMatch(/\n\s+at /);
  });
});
