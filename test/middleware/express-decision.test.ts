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
    await serve(app, ['/s/sub', '/pre', '/assign', '/two', '/none', '/none']);
    expect(seen).toEqual({ sub: 4, parent: 4, pre: 4, before: 4, after: 42, two: 9, none: undefined });
  });

  it('reads the decision of a limiter two apps deep in the root app, and after res.locals is replaced', async () => {
    const express = (await import(version)).default as typeof express5;
    const seen: Record<string, unknown> = {};
    const root = express();
    const mid = express();
    const leaf = express();
    leaf.use(rateLimit({ capacity: 1, rate: '1/h', key: 'deep', policy: 'deep' }));
    leaf.get('/x', (req, res, next) => {
      res.locals = { user: 'u' };
      // Read through a Proxy of the request too, as a library wrapping it would.
      seen.proxy = (new Proxy(req, {}) as express5.Request).rateLimit?.remaining;
      next();
    });
    mid.use('/leaf', leaf);
    root.use('/mid', mid);
    root.get('/mid/leaf/x', (req, res) => {
      seen.root = req.rateLimit?.remaining;
      res.send('ok');
    });
    root.use((_err: unknown, req: express5.Request, res: express5.Response, _next: express5.NextFunction) => {
      seen.error = req.rateLimit?.allowed;
      res.status(429).send('x');
    });
    await serve(root, ['/mid/leaf/x', '/mid/leaf/x']);
    expect(seen).toEqual({ proxy: 0, root: 0, error: false });
  });

  it('leaves every prototype alone for a request Express did not make, and works with Express’s request prototype frozen', async () => {
    const express = (await import(version)).default as typeof express5;
    // Called by hand, as a unit test might: the decision is the request's own property.
    const limiter = rateLimit({ capacity: 5, rate: '1/s', key: 'hand', policy: 'hand' });
    const headers: Record<string, string> = {};
    const res = { locals: {}, getHeader: (n: string) => headers[n], setHeader: (n: string, v: string) => void (headers[n] = v) };
    const req = { res, headers: {} } as unknown as express5.Request;
    await new Promise<void>((resolve, reject) => limiter(req, res as never, (e?: unknown) => (e === undefined ? resolve() : reject(e as Error))));
    expect(Object.getOwnPropertyDescriptor(req, 'rateLimit')?.value).toMatchObject({ allowed: true, remaining: 4 });
    expect('rateLimit' in {}).toBe(false);
    expect(Object.prototype.hasOwnProperty.call(Object.getPrototypeOf(Object.getPrototypeOf(express.request)), 'rateLimit')).toBe(false);
    // A frozen prototype (hardened apps do this): the decision is the request's own property again.
    const app = express();
    Object.freeze(Object.getPrototypeOf(app.request));
    const seen: unknown[] = [];
    app.use(rateLimit({ capacity: 5, rate: '1/s', key: 'frozen', policy: 'frozen' }));
    app.get('/', (request, response) => {
      seen.push(request.rateLimit?.remaining);
      response.send('ok');
    });
    await serve(app, ['/']);
    expect(seen).toEqual([4]);
  });
});

/** Serves `app` on a loopback port for the requests to `paths`, one after another. */
async function serve(app: http.RequestListener, paths: string[]): Promise<void> {
  const server = http.createServer(app).listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  try {
    const { port } = server.address() as AddressInfo;
    for (const path of paths) await (await fetch(`http://127.0.0.1:${port}${path}`)).text();
  } finally {
    server.close();
  }
}
