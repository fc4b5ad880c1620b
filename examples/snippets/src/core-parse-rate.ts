// packages/core/README.md "Token bucket": rates as numbers or strings, parsed by parseRate.
// #region readme
import { parseRate } from '@hasp/core';

const perSecond = [parseRate(2), parseRate('30/min'), parseRate('5/10s'), parseRate('1/500ms')]; // [2, 0.5, 0.5, 2]
// #endregion readme

import { assert } from './check.js';
assert.deepEqual(perSecond, [2, 0.5, 0.5, 2]);
assert.equal(parseRate('1000/d').toFixed(6), '0.011574');
assert.throws(() => parseRate('fast'), RangeError);
