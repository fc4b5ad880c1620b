// Express rateLimit with a custom handler that passes a refused request on: the earlier limiters' takes stay spent
// (the request was served), also when its client leaves first or it goes on with next('route'). Pinned after mutation
// testing (review 56).
import { TokenBucket } from '@hasp/core';
import { describe, expect, it } from 'vitest';
import { until } from '../core/helpers.js';
import { deferred, send } from './apps.js';
import { frameworkSuite } from './suite.js';

describe.each(['express4', 'express5'] as const)('a custom handler on %s', (name) => {
  const suite = frameworkSuite(name);

  /** A per-client limiter with room, then a one-request limiter whose refusals go to `handler`. */
  const limiters = (client: TokenBucket, handler: (req: unknown, res: unknown, next: (e?: unknown) => void) => unknown) => [
    suite.fw().rateLimit({ bucket: client, policy: 'client', key: 'client' }),
    suite.fw().rateLimit({ capacity: 1, rate: '1/h', policy: 'phone', key: 'phone', handler }),
  ];

  it('keeps the earlier takes when the client leaves before the handler answered (it may still pass the request on)', async () => {
    const client = new TokenBucket({ capacity: 10, rate: '1/h' });
    const reached = deferred();
    const gate = deferred();
    let passed = 0;
    const app = await suite.start({
      routes: {
        '/x': {
          use: limiters(client, async (_req, _res, next) => {
            reached.resolve();
            await gate.promise;
            next(); // lets the refused request through after all
          }),
          express: (_req: unknown, res: { end(b: string): void }) => {
            passed++;
            res.end('ok');
          },
        },
      },
    });
    await send(`${app.url}/x`).response; // admitted by both, served (no answer needed: handler counts)
    const refused = send(`${app.url}/x`);
    await reached.promise;
    refused.abort();
    // The server has to see the client leave before the handler goes on (a give-back, wrongly, would start then).
    await new Promise((r) => setTimeout(r, 200));
    gate.resolve();
    await until(() => passed === 2, 2_000, 'the handler to pass the request on');
    // Both requests were let through, so both count in the client's budget: 8 left, a peek of 1 says 7.
    expect((await client.peek('client')).remaining).toBe(7);
  });
  it("counts a refused request whose handler passes it on with next('route') (EX4)", async () => {
    const client = new TokenBucket({ capacity: 10, rate: '1/h' });
    const app = await suite.start({
      errors: 'default',
      routes: {
        '/y': {
          use: limiters(client, (_req, _res, next) => next('route')),
          express: (_req: unknown, res: { end(b: string): void }) => res.end('ok'),
        },
      },
    });
    expect((await send(`${app.url}/y`).response).status).toBe(200);
    // Refused by 'phone', passed on to the next route (none here: Express's 404 answers it).
    expect((await send(`${app.url}/y`).response).status).toBe(404);
    // A quiet period for a give-back that must not come.
    await new Promise((r) => setTimeout(r, 100));
    expect((await client.peek('client')).remaining).toBe(7);
  });
});

