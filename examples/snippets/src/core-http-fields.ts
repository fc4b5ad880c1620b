// packages/core/README.md "@hasp/core/http": the RateLimit field serializer and the client-IP key, for adapter authors.
// #region readme
import { clientIpKey, RateLimitFields } from '@hasp/core/http';

const fields = new RateLimitFields('sms', 10, 2); // policy name, capacity, rate (tokens per second)
const policy = fields.policy; // '"sms";q=10;w=5'
const state = fields.rateLimit({ allowed: true, limit: 10, remaining: 3, retryAfter: 0, resetAfter: 3_500 }); // '"sms";r=3;t=1'

const v4 = clientIpKey('::ffff:192.0.2.7'); // '192.0.2.7'
const v6 = clientIpKey('2001:db8:1:2:3:4:5:6'); // '2001:db8:1:2::/64'
// #endregion readme

import { assert } from './check.js';
assert.equal(policy, '"sms";q=10;w=5');
assert.equal(state, '"sms";r=3;t=1');
assert.equal(fields.rateLimit({ allowed: true, limit: 10, remaining: 10, retryAfter: 0, resetAfter: 0 }), '"sms";r=10;t=0');
assert.equal(v4, '192.0.2.7');
assert.equal(v6, '2001:db8:1:2::/64');
