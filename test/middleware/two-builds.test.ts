// An app may load both builds of @hasp/core (ESM and CommonJS: `import` in one place, `require` in another).
// withLock shares its lockers across them, so routes of either exclude each other.
// A rate limiter takes from a hasp TokenBucket through the bucket's store, which records each take on the request so a
// later limiter's refusal can give it back. A bucket whose store it cannot reach (made by the other build of
// @hasp/core, an app loading both its ESM and its CommonJS build; a Proxy around one; a subclass overriding take())
// works through take() alone: the limiter warns, once per process, that such a bucket gets nothing back.
import { createRequire } from 'node:module';
import { Redis } from 'ioredis';
import { describe, expect, it, vi } from 'vitest';
import type { TokenBucket as Bucket } from '../../packages/core/src/index.js';

const require = createRequire(import.meta.url);

/** Core's modules loaded afresh, and its record of warnings emitted (on globalThis) cleared: a process that has not warned yet. */
async function freshCore() {
  vi.resetModules();
  delete (globalThis as { [k: symbol]: unknown })[Symbol.for('hasp.warned')];
  const { RateLimiter } = await import('../../packages/core/src/http/rate-limiter.js');
  const { TokenBucket } = await import('../../packages/core/src/index.js');
  return { RateLimiter, TokenBucket };
}

/** The HASP_BUCKET_NO_GIVE_BACK warnings emitted while `fn` runs (and the turn after it). */
async function warningsOf(fn: () => void): Promise<string[]> {
  const seen: string[] = [];
  const onWarning = (w: Error & { code?: string }) => {
    if (w.code === 'HASP_BUCKET_NO_GIVE_BACK') seen.push(w.message);
  };
  process.on('warning', onWarning);
  try {
    fn();
    await new Promise((r) => setImmediate(r));
  } finally {
    process.off('warning', onWarning);
  }
  return seen;
}

const MESSAGE = /other build of @hasp\/core.*Proxy.*overrides take\(\).*not given back/;

describe('buckets a rate limiter can only call take() on', () => {
  it("warns for none of its own build's buckets, a subclass that keeps take() included", async () => {
    const { RateLimiter, TokenBucket } = await freshCore();
    class Plain extends TokenBucket {}
    const warned = await warningsOf(() => {
      for (const bucket of [new TokenBucket({ capacity: 2, rate: '2/min' }), new Plain({ capacity: 2, rate: '2/min' })]) {
        new RateLimiter({ bucket, key: 'k' }, () => 'k');
      }
    });
    expect(warned).toEqual([]);
  });

  it("takes through a subclass's own take(), with a request's home too, and warns once", async () => {
    const { RateLimiter, TokenBucket } = await freshCore();
    let counted = 0;
    class Counted extends TokenBucket {
      override take(key: string, cost?: number) {
        counted++;
        return super.take(key, cost);
      }
    }
    let limiter: InstanceType<typeof RateLimiter> | undefined;
    const warned = await warningsOf(() => {
      for (let i = 0; i < 2; i++) limiter = new RateLimiter({ bucket: new Counted({ capacity: 2, rate: '2/min' }), key: 'k' }, () => 'k');
    });
    expect(warned).toEqual([expect.stringMatching(MESSAGE)]);
    // With a request's home (as the middleware checks) and without: both through the subclass's take().
    await limiter!.check({}, {});
    await limiter!.check({});
    expect(counted).toBe(2);
  });

  it('warns for a bucket of the other build (CommonJS, as a CommonJS library of the app loads it) and for a Proxy', async () => {
    // The CommonJS build needs `pnpm build`.
    const cjs = require('../../packages/core/dist/index.cjs') as { TokenBucket: typeof Bucket };
    for (const make of [
      (_: typeof Bucket) => new cjs.TokenBucket({ capacity: 2, rate: '2/min' }),
      (TB: typeof Bucket) => new Proxy(new TB({ capacity: 2, rate: '2/min' }), {}),
    ]) {
      const { RateLimiter, TokenBucket } = await freshCore();
      const bucket = make(TokenBucket);
      expect(await warningsOf(() => new RateLimiter({ bucket, key: 'k' }, () => 'k'))).toEqual([expect.stringMatching(MESSAGE)]);
    }
  });
});

describe('withLock in both builds', () => {
  it('shares the MemoryLock of the process and the locker of a client', async () => {
    // The CommonJS build needs `pnpm build`; the sources stand in for the ESM build.
    const cjs = require('../../packages/core/dist/http.cjs') as typeof import('../../packages/core/src/http/index.js');
    const esm = await import('../../packages/core/src/http/index.js');
    expect(cjs.lockerFor({})).toBe(esm.lockerFor({}));
    const client = new Redis({ lazyConnect: true });
    try {
      expect(cjs.lockerFor({ redis: client })).toBe(esm.lockerFor({ redis: client }));
      expect(cjs.lockerFor({ redis: [client] })).toBe(esm.lockerFor({ redis: [client] }));
    } finally {
      client.disconnect();
    }
  });
});

describe('warnings with both builds loaded', () => {
  it('warns once per process, not once per build', async () => {
    const { RateLimiter, TokenBucket } = await freshCore();
    const cjs = require('../../packages/core/dist/http.cjs') as typeof import('../../packages/core/src/http/index.js');
    const warned = await warningsOf(() => {
      new RateLimiter({ bucket: new Proxy(new TokenBucket({ capacity: 2, rate: '2/min' }), {}), key: 'k' }, () => 'k');
      new cjs.RateLimiter({ bucket: new TokenBucket({ capacity: 2, rate: '2/min' }), key: 'k' }, () => 'k');
    });
    expect(warned).toEqual([expect.stringMatching(MESSAGE)]);
  });
});
