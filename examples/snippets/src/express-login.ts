// packages/express/README.md "rateLimit": a shared TokenBucket that a successful login refills, and a custom handler.
// #region readme
import express from 'express';
import { TokenBucket } from '@hasp/core';
import { rateLimit } from '@hasp/express';

// 5 attempts per username and IP per 15 minutes (add `redis` to share them between processes).
const attempts = new TokenBucket({ capacity: 5, rate: '5/15min' });
const attemptKey = (req: express.Request) => `${req.body.username}|${req.ip}`;

const app = express();
app.use(express.json());
app.post(
  '/login',
  rateLimit({
    bucket: attempts,
    policy: 'login',
    key: attemptKey,
    // Answer a denied request yourself instead of next(err); Retry-After and the RateLimit fields are already set.
    handler: (req, res, next, decision) => {
      res.status(429).json({ error: 'too many attempts', retryInSeconds: Math.ceil(decision.retryAfter / 1000) });
    },
  }),
  async (req, res) => {
    if (!(await passwordMatches(req.body.username, req.body.password))) {
      res.status(401).json({ error: 'wrong username or password' });
      return;
    }
    await attempts.reset(attemptKey(req)); // a successful login refills the bucket
    res.json({ ok: true });
  },
);
// #endregion readme

async function passwordMatches(username: string, password: string): Promise<boolean> {
  return username === 'alice' && password === 'wonderland';
}

import { assert, send, serve, statuses } from './check.js';
const { url, close } = await serve(app);
const wrong = { username: 'alice', password: 'guess' };
assert.deepEqual(await statuses(4, 'POST', `${url}/login`, wrong), [401, 401, 401, 401]);
assert.equal((await send('POST', `${url}/login`, { username: 'alice', password: 'wonderland' })).status, 200);
assert.deepEqual(await statuses(6, 'POST', `${url}/login`, wrong), [401, 401, 401, 401, 401, 429]);
const denied = await send('POST', `${url}/login`, wrong);
assert.equal(denied.status, 429);
assert.equal((denied.body as { error: string }).error, 'too many attempts');
assert.ok(Number(denied.headers.get('retry-after')) >= 1);
await close();
