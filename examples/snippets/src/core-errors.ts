// packages/core/README.md "Errors": branch on the stable code of a HaspError.
// #region readme
import { HaspError, MemoryLock } from '@hasp/core';

const locks = new MemoryLock();
const held = await locks.acquire('invoice:7');
try {
  await locks.acquire('invoice:7'); // busy: rejects at once, since wait defaults to 0
} catch (err) {
  if (!(err instanceof HaspError)) throw err;
  switch (err.code) {
    case 'LOCK_BUSY':
      console.log('someone else is on it');
      break;
    case 'LOCK_UNAVAILABLE':
      console.log('Redis is down: try again later');
      break;
    default:
      throw err;
  }
}
await held.release();
// #endregion readme

import { LockBusyError } from '@hasp/core';
import { assert } from './check.js';
const again = await locks.acquire('invoice:7');
const err = await locks.acquire('invoice:7').catch((e: unknown) => e);
assert.ok(err instanceof LockBusyError);
assert.equal(err.code, 'LOCK_BUSY');
assert.ok(err.retryAfter !== undefined && err.retryAfter > 0);
await again.release();
