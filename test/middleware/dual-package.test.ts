// An app that loads both builds of @hasp/core (ESM and CommonJS) can hand a limiter a TokenBucket of the other build:
// it works, but its takes cannot be given back, so the limiter warns (HASP_DUAL_PACKAGE), once per process.
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { RateLimiter } from '../../packages/core/src/http/rate-limiter.js';
import { TokenBucket } from '../../packages/core/src/index.js';

const require = createRequire(import.meta.url);

describe('a TokenBucket from the other build of @hasp/core', () => {
  it('warns once that its takes are not given back; a bucket of the same build does not', async () => {
    const warnings: { code?: string; message: string }[] = [];
    const onWarning = (w: Error & { code?: string }) => warnings.push({ code: w.code, message: w.message });
    process.on('warning', onWarning);
    try {
      const own = new TokenBucket({ capacity: 2, rate: '2/min' });
      new RateLimiter({ bucket: own, key: 'k' }, () => 'k');
      await new Promise((r) => setImmediate(r));
      expect(warnings.filter((w) => w.code === 'HASP_DUAL_PACKAGE')).toEqual([]);
      // The CommonJS build (needs `pnpm build`), as a CommonJS library of the app's would load it.
      const cjs = require('../../packages/core/dist/index.cjs') as { TokenBucket: typeof TokenBucket };
      const foreign = new cjs.TokenBucket({ capacity: 2, rate: '2/min' });
      expect(foreign instanceof TokenBucket).toBe(false);
      for (let i = 0; i < 2; i++) new RateLimiter({ bucket: foreign, key: 'k' }, () => 'k');
      await new Promise((r) => setImmediate(r));
      const dual = warnings.filter((w) => w.code === 'HASP_DUAL_PACKAGE');
      expect(dual).toHaveLength(1);
      expect(dual[0]!.message).toMatch(/other build of @hasp\/core/);
    } finally {
      process.off('warning', onWarning);
    }
  });
});
