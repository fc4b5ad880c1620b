// README.md "Quick start", Express: a per-phone SMS limit and a per-order purchase lock, shared through Redis.
// #region readme
import express from 'express';
import { Redis } from 'ioredis';
import { rateLimit, withLock } from '@hasp/express';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const app = express();
app.use(express.json());

// 3 SMS per phone number per 10 minutes, across all app instances sharing this Redis.
app.post('/sms/send', rateLimit({ capacity: 3, rate: '3/10min', redis, key: (req) => String(req.body?.phone), policy: 'sms' }), sendSms);

// One purchase per order at a time: a second request while the first runs gets 423.
app.post('/orders/:id/purchase', withLock((req) => `order:${req.params.id}`, { redis }), purchase);
// #endregion readme

function sendSms(_req: express.Request, res: express.Response): void {
  res.json({ sent: true });
}
async function purchase(_req: express.Request, res: express.Response): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 300));
  res.json({ purchased: true });
}

import { assert, send, serve, statuses } from './check.js';
const { url, close } = await serve(app);
assert.deepEqual(await statuses(4, 'POST', `${url}/sms/send`, { phone: '+15551234567' }), [200, 200, 200, 429]);
const both = await Promise.all([send('POST', `${url}/orders/1/purchase`), send('POST', `${url}/orders/1/purchase`)]);
assert.deepEqual(both.map((r) => r.status).sort(), [200, 423]);
await close();
await redis.quit();
