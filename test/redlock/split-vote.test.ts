// Redlock split votes: a round where no token reaches the quorum although nobody holds the key on a quorum either
// (two callers each winning a minority, or a stale lock on one node while another is down). Redlock prescribes a retry
// after a random pause; without it, a double submit with `wait: 0` makes both callers walk away busy from a key that
// nobody holds.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { RedisLock } from '../../packages/core/src/index.js';
import { startRedisNodes, stopAll } from '../harness/redis.js';
import { freshPrefix, Nodes } from './support.js';

let nodes: Nodes;

beforeAll(async () => {
  nodes = new Nodes(await startRedisNodes(3));
});

afterAll(async () => {
  nodes?.close();
  await stopAll();
});

it('retries a split vote with wait 0 instead of answering busy for a key nobody holds', async () => {
  const prefix = freshPrefix('split');
  // Retries for about a second (20 × 50 ms), so that a stale lock of 250 ms expires within them even on a loaded
  // machine (with 40 ms, the stale lock's own acquire took longer than its ttl under load, and failed).
  const { locker, clients } = nodes.redlock({ prefix, retryCount: 20, retryDelay: 50 });
  // Node 2 down; node 1 holds a stale lock of someone else (what a racing caller leaves for a moment): the first round
  // wins node 0 only, one vote short, with only one node busy: a split, not a busy key.
  await nodes.kill([2], [clients]);
  const stale = new RedisLock(nodes.admins[1]!, { prefix });
  for (let round = 0; round < 5; round++) {
    const key = `order:${round}`;
    const staleAt = performance.now();
    expect(await stale.tryAcquire(key, { ttl: 250 })).not.toBeNull();
    const started = performance.now();
    const lease = await locker.tryAcquire(key, { ttl: 5_000 });
    expect(lease, `round ${round}: the retry after the stale lock expired wins`).not.toBeNull();
    // It did wait for a retry past the stale lock's end, and not much longer than the retries allow.
    expect(performance.now() - staleAt).toBeGreaterThanOrEqual(240);
    expect(performance.now() - started).toBeLessThan(3_000);
    await lease!.release();
  }
  stale.close();
  locker.close();
});
