// Express's `req.rateLimit`: kept in res.locals and read through an accessor on Express's request prototype (adding a
// property to a request costs Express ~3 µs a request), it must read as the plain property it stands for: in the
// handlers after the limiter, in a parent app's error handler after a sub-app, after an app's own assignment.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { rateLimit } from '@hasp/express';
import type express5 from 'express5';
import { describe, expect, it } from 'vitest';

const VERSIONS = ['express4', 'express5'] as const;

describe.each(VERSIONS)('req.rateLimit on %s', (version) => {
  it('reads each request’s own decision, across sub-apps, assignments and stacked limiters', async () => {
    const express = (await import(version)).default as typeof express5;
    const seen: Record<string, unknown> = {};
    const app = express();
    const sub = express();
    sub.use(rateLimit({ capacity: 5, rate: '1/s', key: 'sub', policy: 'sub' }));
    sub.get('/sub', (req, _res, next) => {
      seen.sub = req.rateLimit?.remaining;
      next(new Error('boom'));
    });
    app.use('/s', sub);
    app.get(
      '/pre',
      (req, _res, next) => {
        (req as { rateLimit?: unknown }).rateLimit = 'mine';
        next();
      },
      rateLimit({ capacity: 5, rate: '1/s', key: 'pre', policy: 'pre' }),
      (req, res) => {
        seen.pre = req.rateLimit?.remaining;
        res.send('ok');
      },
    );
    app.get('/assign', rateLimit({ capacity: 5, rate: '1/s', key: 'assign', policy: 'assign' }), (req, res) => {
      seen.before = req.rateLimit?.remaining;
      (req as { rateLimit?: unknown }).rateLimit = 42;
      seen.after = req.rateLimit;
      res.send('ok');
    });
    app.get(
      '/two',
      rateLimit({ capacity: 5, rate: '1/s', key: 'two-a', policy: 'a' }),
      rateLimit({ capacity: 9, rate: '1/s', key: 'two-b', policy: 'b' }),
      (req, res) => {
        seen.two = req.rateLimit?.limit;
        res.send('ok');
      },
    );
    app.get('/none', (req, res) => {
      seen.none = req.rateLimit;
      res.send('ok');
    });
    app.use((_err: unknown, req: express5.Request, res: express5.Response, _next: express5.NextFunction) => {
      seen.parent = req.rateLimit?.remaining;
      res.status(500).send('x');
    });
    const server = http.createServer(app).listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    try {
      const { port } = server.address() as AddressInfo;
      for (const path of ['/s/sub', '/pre', '/assign', '/two', '/none', '/none']) {
        await (await fetch(`http://127.0.0.1:${port}${path}`)).text();
      }
    } finally {
      server.close();
    }
    expect(seen).toEqual({ sub: 4, parent: 4, pre: 4, before: 4, after: 42, two: 9, none: undefined });
  });
});
