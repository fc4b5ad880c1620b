// Express withLock that gets its lock for a response already answered (a timeout middleware answered while the
// request waited) lets it go at once, pinned after mutation testing (review 56): nothing covered that branch, and
// auto-extension would have kept the lock for good.
import { MemoryLock } from '@hasp/core';
import { describe, expect, it } from 'vitest';
import { until } from '../core/helpers.js';
import { FRAMEWORKS, get } from './apps.js';
import { frameworkSuite } from './suite.js';

describe.each(FRAMEWORKS)('withLock on %s', (name) => {
  const suite = frameworkSuite(name);

  it.runIf(name.startsWith('express'))('releases a lock it got for a response answered while it waited (a timeout middleware)', async () => {
    const locker = new MemoryLock();
    const timeout = (_req: unknown, res: { end(b: string): void }, next: () => void) => {
      setTimeout(() => res.end('timed out'), 100);
      next();
    };
    const app = await suite.start({
      routes: { '/x': { use: [timeout, suite.fw().withLock(() => 'k', { locker, wait: 2_000, ttl: 1_000 })], handle: () => ({ body: 'ok' }) } },
    });
    const lease = await locker.acquire('k', { ttl: 1_000 });
    const r = await get(`${app.url}/x`);
    expect(r.body).toBe('timed out');
    await lease.release(); // the waiting request gets the lock now, for a response already sent
    // It must let go at once: the lock is free again (well before its 1 s ttl, which auto-extension would renew).
    await until(
      async () => locker.acquire('k', { wait: 0 }).then((l) => (void l.release(), true), () => false),
      2_500,
      'the lock to be free again',
    );
  });
});
