// The 429 of rateLimit as an http-errors error: same shape as every other HttpError, made without a stack trace.
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { rateLimitedError } from '../../packages/core/src/http/errors.js';

// The copy of http-errors core itself resolves, so instanceof compares against the same class.
const createError = createRequire(new URL('../../packages/core/package.json', import.meta.url))('http-errors') as {
  (status: number, message: string): Error;
  HttpError: abstract new () => Error;
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

  it('leaves Error.stackTraceLimit as it was, also for other errors made afterwards', () => {
    const before = Error.stackTraceLimit;
    rateLimitedError(decision, {});
    expect(Error.stackTraceLimit).toBe(before);
    expect(String(new Error('x').stack)).toMatch(/\n\s+at /);
    expect(String(createError(423, 'busy').stack)).toMatch(/\n\s+at /);
  });
});
