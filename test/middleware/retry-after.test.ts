// Retry-After at its edges, pinned after mutation testing (review 56): on a 429 with headers: false behind an error
// page, absent on a 423 whose holder's time is unknown, 1 (never 0) when the holder has 0 ms left, and a refusal after
// an earlier middleware sent the headers still reaches the app's error handling.
import { LockBusyError, MemoryLock } from '@hasp/core';
import { describe, expect, it } from 'vitest';
import { until } from '../core/helpers.js';
import { trackUnhandled } from '../redlock/support.js';
import { deferred, FRAMEWORKS, get } from './apps.js';
import { frameworkSuite } from './suite.js';

describe.each(FRAMEWORKS)('withLock refusals on %s', (name) => {
  const suite = frameworkSuite(name);

  it('puts Retry-After on a 429 response with headers: false, also behind an error page that sends none of err.headers', async () => {
    const app = await suite.start({
      errors: 'page',
      routes: { '/x': { use: [suite.fw().rateLimit({ capacity: 1, rate: '1/h', key: 'k', headers: false })], handle: () => ({ body: 'ok' }) } },
    });
    expect((await get(`${app.url}/x`)).status).toBe(200);
    const r = await get(`${app.url}/x`);
    expect(r.status).toBe(429);
    expect(Number(r.headers['retry-after'])).toBeGreaterThan(3_000);
    expect(r.headers['ratelimit']).toBeUndefined();
  });

  it('sends no Retry-After on a 423 when the holder’s remaining time is unknown', async () => {
    // A locker that reports busy without the holder's time (LockBusyError without retryAfter).
    const locker = {
      using: () => Promise.reject(new LockBusyError('k')),
      acquire: () => Promise.reject(new LockBusyError('k')),
    };
    const app = await suite.start({ routes: { '/x': { use: [suite.fw().withLock(() => 'k', { locker })], handle: () => ({ body: 'ran' }) } } });
    const r = await get(`${app.url}/x`);
    expect(r.status).toBe(423);
    expect(r.headers['retry-after']).toBeUndefined();
    expect(app.errors[0]?.headers?.['Retry-After']).toBeUndefined();
  });

  it('sends Retry-After: 1 on a 423 whose holder has 0 ms left (never no field, never 0)', async () => {
    const locker = {
      using: () => Promise.reject(new LockBusyError('k', 0)),
      acquire: () => Promise.reject(new LockBusyError('k', 0)),
    };
    const app = await suite.start({ routes: { '/x': { use: [suite.fw().withLock(() => 'k', { locker })], handle: () => ({ body: 'ran' }) } } });
    const r = await get(`${app.url}/x`);
    expect(r.status).toBe(423);
    expect(r.headers['retry-after']).toBe('1');
  });

  it('refuses a busy lock through the error handling when an earlier middleware already sent the headers', async () => {
    const unhandled = trackUnhandled();
    try {
      const locker = new MemoryLock();
      const gate = deferred();
      const reached = deferred();
      const lock = suite.fw().withLock(() => 'k', { locker, ttl: 5_000 });
      const early =
        suite.fw().kind === 'express'
          ? (_req: unknown, res: { writeHead(s: number): void; write(b: string): void }, next: () => void) => {
              res.writeHead(200);
              res.write('early');
              next();
            }
          : (ctx: { res: { writeHead(s: number): void; write(b: string): void } }, next: () => Promise<void>) => {
              ctx.res.writeHead(200);
              ctx.res.write('early');
              return next();
            };
      const app = await suite.start({
        routes: {
          '/hold': {
            use: [lock],
            handle: async () => {
              reached.resolve();
              await gate.promise;
              return { body: 'held' };
            },
          },
          '/x': { use: [early, lock], handle: () => ({ body: 'ran' }) },
        },
      });
      const holding = get(`${app.url}/hold`);
      await reached.promise;
      void get(`${app.url}/x`).catch(() => undefined);
      await until(() => app.errors.length > 0, 2_000, 'the refusal to reach the app');
      expect(app.errors.map((e) => e.code)).toEqual(['LOCK_BUSY']);
      gate.resolve();
      await holding;
      expect(unhandled.reasons).toEqual([]);
    } finally {
      unhandled.stop();
    }
  });
});
