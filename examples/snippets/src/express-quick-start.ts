// packages/express/README.md "Quick start": rateLimit and withLock on the in-memory default.
// #region readme
import express from 'express';
import { rateLimit, withLock } from '@hasp/express';

const app = express();
app.use(express.json());

// 3 SMS per phone number per 10 minutes: the 4th request gets 429 with Retry-After.
app.post('/sms/send', rateLimit({ capacity: 3, rate: '3/10min', key: (req) => String(req.body?.phone), policy: 'sms' }), (req, res) => {
  res.json({ sent: true, left: req.rateLimit?.remaining });
});

// One purchase per order at a time: a double submit gets 423 Locked while the first request still runs.
app.post('/orders/:id/purchase', withLock((req) => `order:${req.params.id}`), async (req, res) => {
  const order = String(req.params.id);
  await chargeCustomer(order, req.lock!.fence);
  res.json({ purchased: order });
});
// #endregion readme

// The reader's own code.
async function chargeCustomer(_order: string, _fence: number): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 300));
}

// Check what the README says.
import { assert, send, serve, statuses } from './check.js';
const { url, close } = await serve(app);
assert.deepEqual(await statuses(4, 'POST', `${url}/sms/send`, { phone: '+15551234567' }), [200, 200, 200, 429]);
const denied = await send('POST', `${url}/sms/send`, { phone: '+15551234567' });
assert.equal(denied.headers.get('ratelimit-policy'), '"sms";q=3;w=600');
assert.match(denied.headers.get('ratelimit') ?? '', /^"sms";r=0;t=\d+$/);
assert.ok(Number(denied.headers.get('retry-after')) >= 1);
// A phone sent as a number, or none at all, is still a key: never a 500 from the limiter.
assert.equal((await send('POST', `${url}/sms/send`, { phone: 15551234567 })).status, 200);
assert.equal((await send('POST', `${url}/sms/send`, undefined)).status, 200);
const both = await Promise.all([send('POST', `${url}/orders/42/purchase`), send('POST', `${url}/orders/42/purchase`)]);
assert.deepEqual(both.map((r) => r.status).sort(), [200, 423]);
await close();
