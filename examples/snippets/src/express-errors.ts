// packages/express/README.md "Errors": an error handler that sends hasp's http-errors as JSON, headers included.
import express from 'express';
import { rateLimit, withLock } from '@hasp/express';

const app = express();
app.get('/limited', rateLimit({ capacity: 1, rate: '1/h' }), (req, res) => {
  res.json({ ok: true });
});
app.post('/locked', withLock(() => 'the-one-key'), async (req, res) => {
  await new Promise((resolve) => setTimeout(resolve, 300));
  res.json({ ok: true });
});
// #region readme
import type { ErrorRequestHandler } from 'express';

// After the routes. hasp passes http-errors to next(err): status, expose, code, and the headers to send.
const jsonErrors: ErrorRequestHandler = (err, req, res, next) => {
  if (res.headersSent) return next(err);
  if (err.headers) res.set(err.headers); // Retry-After; on a 429 also RateLimit-Policy and RateLimit
  const status = err.status ?? err.statusCode ?? 500;
  res.status(status).json({ code: err.code, message: err.expose ? err.message : 'Internal Server Error' });
};
app.use(jsonErrors);
// #endregion readme

import { assert, send, serve } from './check.js';
const { url, close } = await serve(app);
assert.equal((await send('GET', `${url}/limited`)).status, 200);
const limited = await send('GET', `${url}/limited`);
assert.equal(limited.status, 429);
assert.deepEqual(limited.body, { code: 'RATE_LIMITED', message: 'Too many requests: rate limit exceeded' });
assert.equal(limited.headers.get('retry-after'), '3600');
assert.equal(limited.headers.get('ratelimit'), '"default";r=0;t=3600');
const [a, b] = await Promise.all([send('POST', `${url}/locked`), send('POST', `${url}/locked`)]);
const busy = a!.status === 423 ? a! : b!;
assert.equal(busy.status, 423);
assert.equal((busy.body as { code: string }).code, 'LOCK_BUSY');
await close();
