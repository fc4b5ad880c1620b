// Three limiters on a route, the third refuses: both earlier limiters get their token back, not only the one just
// before the refusal. Pinned after mutation testing (review 56) found only pairs tested.
import { TokenBucket } from '@hasp/core';
import { describe, expect, it } from 'vitest';
import { FRAMEWORKS, get } from './apps.js';
import { frameworkSuite } from './suite.js';

describe.each(FRAMEWORKS)('three stacked limiters on %s', (name) => {
  const suite = frameworkSuite(name);

  it('a refusal by the third gives back the takes of both limiters before it', async () => {
    const first = new TokenBucket({ capacity: 10, rate: '1/h' });
    const second = new TokenBucket({ capacity: 10, rate: '1/h' });
    const app = await suite.start({
      routes: {
        '/sms': {
          use: [
            suite.fw().rateLimit({ bucket: first, policy: 'first', key: 'client' }),
            suite.fw().rateLimit({ bucket: second, policy: 'second', key: 'client' }),
            suite.fw().rateLimit({ capacity: 1, rate: '1/h', policy: 'phone', key: (r: { query: { phone?: string } }) => r.query.phone }),
          ],
        },
      },
    });
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) statuses.push((await get(`${app.url}/sms?phone=1`)).status);
    expect(statuses).toEqual([200, 429, 429, 429]);
    // One request was served: each earlier bucket spent exactly one token (9 left: a peek of 1 leaves 8).
    expect((await second.peek('client')).remaining).toBe(8);
    expect((await first.peek('client')).remaining).toBe(8);
  });
});
