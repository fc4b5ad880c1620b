// packages/express/README.md "rateLimit": two limiters on one route on Redis, and a weighted cost per request.
// #region readme
import express from 'express';
import { Redis } from 'ioredis';
import { rateLimit } from '@hasp/express';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const app = express();
app.use(express.json());

app.post(
  '/sms/send',
  // Per client IP (the default key): 10 per 10 minutes.
  rateLimit({ capacity: 10, rate: '10/10min', redis, policy: 'sms-ip' }),
  // Per phone number: 3 per 10 minutes. Each limiter adds its member to RateLimit-Policy and RateLimit.
  rateLimit({ capacity: 3, rate: '3/10min', redis, policy: 'sms-phone', key: (req) => String(req.body?.phone) }),
  (req, res) => {
    res.json({ sent: true });
  },
);

// 100 tokens per hour per API key; an xlsx export costs 10. Requests without a key (or with an empty one) are not
// limited by this one.
const perApiKey = rateLimit({
  capacity: 100,
  rate: '100/h',
  redis,
  policy: 'api',
  key: (req) => req.get('x-api-key') || undefined,
  cost: (req) => (req.query.format === 'xlsx' ? 10 : 1),
});
app.get('/export', perApiKey, (req, res) => {
  res.json({ format: req.query.format ?? 'csv', tokensLeft: req.rateLimit?.remaining });
});
// #endregion readme

import { assert, send, serve, statuses } from './check.js';
const { url, close } = await serve(app);
assert.deepEqual(await statuses(4, 'POST', `${url}/sms/send`, { phone: '+15550000001' }), [200, 200, 200, 429]);
const sms = await send('POST', `${url}/sms/send`, { phone: '+15550000002' });
assert.equal(sms.headers.get('ratelimit-policy'), '"sms-ip";q=10;w=600, "sms-phone";q=3;w=600');
// 6 left for the IP, not 5: the request the phone limit refused cost the IP limit nothing (its token went back).
assert.match(sms.headers.get('ratelimit') ?? '', /^"sms-ip";r=6;t=\d+, "sms-phone";r=2;t=\d+$/);
const xlsx = await send('GET', `${url}/export?format=xlsx`, undefined);
assert.equal(xlsx.headers.get('ratelimit'), null); // no x-api-key: not limited
const empty = await fetch(`${url}/export`, { headers: { 'x-api-key': '' } });
assert.equal(empty.status, 200); // an empty one neither (not a 500 for a bad key)
assert.equal(empty.headers.get('ratelimit'), null);
await empty.text();
assert.equal((await send('POST', `${url}/sms/send`, { phone: 15550000009 })).status, 200); // a number is a phone too
const keyed = await fetch(`${url}/export?format=xlsx`, { headers: { 'x-api-key': 'k1' } });
assert.equal(keyed.headers.get('ratelimit'), '"api";r=90;t=36');
await keyed.text();
await close();
await redis.quit();
