// Bad options of rateLimit() and withLock() fail when the middleware is created (never per request), with a TypeError or
// RangeError naming the option, for Express 4, Express 5, Koa 2 and Koa 3.
import { MemoryLock, Redlock, TokenBucket } from '@hasp/core';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { expectInvalid } from '../core/helpers.js';
import { FRAMEWORKS, framework } from './apps.js';

// Never connect: option checks only look at the clients' shape.
const [redis, redis2, redis3] = [1, 2, 3].map(() => new Redis({ lazyConnect: true, enableOfflineQueue: false })) as [Redis, Redis, Redis];

afterAll(() => {
  for (const c of [redis, redis2, redis3]) c.disconnect();
});

/** A short name for a test value (clients are too big to print). */
function show(value: unknown): string {
  if (value instanceof Redis) return 'a Redis client';
  if (Array.isArray(value)) return `[${value.map(show).join(', ')}]`;
  if (typeof value === 'object' && value !== null && value.constructor !== Object) return `a ${value.constructor.name}`;
  return typeof value === 'number' || value === undefined ? String(value) : JSON.stringify(value);
}

const base = { capacity: 10, rate: 1 };

/** [what is wrong, options, the option the error must name]. */
const badRateLimit: [string, unknown, string][] = [
  ['no capacity', { rate: 1 }, 'capacity'],
  ['no rate', { capacity: 5 }, 'rate'],
  ['nothing', {}, 'capacity'],
  ...[0, -1, NaN, Infinity, -Infinity, '5', null, true, {}].map((v): [string, unknown, string] => [`capacity ${show(v)}`, { ...base, capacity: v }, 'capacity']),
  ['capacity below the default cost', { capacity: 0.5, rate: 1 }, 'capacity'],
  ...[0, -2, NaN, Infinity, 'abc', '0/s', '-1/s', '5/fortnight', '', '2/', null, false, {}, [1]].map((v): [string, unknown, string] => [
    `rate ${show(v)}`,
    { ...base, rate: v },
    'rate',
  ]),
  ...[{}, 'redis://127.0.0.1', 5, null, [redis]].map((v): [string, unknown, string] => [`redis ${show(v)}`, { ...base, redis: v }, 'redis']),
  ...[{}, 5, 'b', null, { take() {} }].map((v): [string, unknown, string] => [`bucket ${show(v)}`, { bucket: v }, 'bucket']),
  ['bucket and capacity', { bucket: new TokenBucket(base), capacity: 5 }, 'capacity'],
  ['bucket and rate', { bucket: new TokenBucket(base), rate: 5 }, 'rate'],
  ['bucket and redis', { bucket: new TokenBucket(base), redis }, 'redis'],
  ...[5, '', {}, null, true, []].map((v): [string, unknown, string] => [`key ${show(v)}`, { ...base, key: v }, 'key']),
  ...[0, -1, NaN, Infinity, '1', 11, null, {}].map((v): [string, unknown, string] => [`cost ${show(v)}`, { ...base, cost: v }, 'cost']),
  ...['yes', 1, 0, null, {}].map((v): [string, unknown, string] => [`headers ${show(v)}`, { ...base, headers: v }, 'headers']),
  ...['no', 0, null].map((v): [string, unknown, string] => [`giveBack ${show(v)}`, { ...base, giveBack: v }, 'giveBack']),
  ...['', 'ümlaut', 'line\nbreak', 'tab\there', 'emoji😀', 'del\u007f', 5, null, {}].map((v): [string, unknown, string] => [
    `policy ${show(v)}`,
    { ...base, policy: v },
    'policy',
  ]),
  ...['fallback', 'MEMORY', '', true, null, 0].map((v): [string, unknown, string] => [
    `onStoreError ${show(v)}`,
    { ...base, onStoreError: v },
    'onStoreError',
  ]),
  ...['log', 5, {}, null, true].map((v): [string, unknown, string] => [`onStoreState ${show(v)}`, { ...base, onStoreState: v }, 'onStoreState']),
  ...['x', 5, {}, null, true].map((v): [string, unknown, string] => [`handler ${show(v)}`, { ...base, handler: v }, 'handler']),
  ['a misspelled option', { capcity: 5, rate: 1 }, 'capcity'],
  ['an unknown option', { ...base, max: 3 }, 'max'],
  ['an option of another library', { ...base, windowMs: 60_000 }, 'windowMs'],
  ...[null, 'x', 5].map((v): [string, unknown, string] => [`options ${show(v)}`, v, 'options']),
];

/** [what is wrong, key, options, the option the error must name]. */
const badWithLock: [string, unknown, unknown, string][] = [
  ...[undefined, 'order', 5, null, {}].map((k): [string, unknown, unknown, string] => [`key ${show(k)}`, k, undefined, 'key']),
  ...['x', 5, null, true].map((o): [string, unknown, unknown, string] => [`options ${show(o)}`, () => 'k', o, 'options']),
  ...[{}, 5, 'x', null, { acquire() {} }, redis].map((l): [string, unknown, unknown, string] => [
    `locker ${show(l)}`,
    () => 'k',
    { locker: l },
    'locker',
  ]),
  ['locker and redis', () => 'k', { locker: new MemoryLock(), redis }, 'locker'],
  ...[{}, 'x', 5, null, [], [{}], [redis, 'x'], new MemoryLock()].map((r): [string, unknown, unknown, string] => [
    `redis ${show(r)}`,
    () => 'k',
    { redis: r },
    'redis',
  ]),
  ...[0, -1, 1.5, NaN, Infinity, '1000', null, 2 ** 31].map((t): [string, unknown, unknown, string] => [
    `ttl ${show(t)}`,
    () => 'k',
    { ttl: t },
    'ttl',
  ]),
  // Within the locker's clock-drift allowance (2 ms on RedisLock; ttl × 0.9 + 2 ms here): every request would fail.
  ['ttl 2 on Redis', () => 'k', { redis, ttl: 2 }, 'ttl'],
  ['ttl 20 on a Redlock allowing ttl × 0.9 for drift', () => 'k', { locker: new Redlock([redis, redis2, redis3], { driftFactor: 0.9 }), ttl: 20 }, 'ttl'],
  ...[-1, 1.5, NaN, Infinity, '0', null].map((w): [string, unknown, unknown, string] => [`wait ${show(w)}`, () => 'k', { wait: w }, 'wait']),
  ...['yes', 1, null, {}].map((a): [string, unknown, unknown, string] => [
    `autoExtend ${show(a)}`,
    () => 'k',
    { autoExtend: a },
    'autoExtend',
  ]),
  ['an unknown option', () => 'k', { timeout: 5 }, 'timeout'],
  ['a misspelled option', () => 'k', { ttl: 1_000, autoextend: false }, 'autoextend'],
];

describe.each(FRAMEWORKS)('options on %s', (name) => {
  it.each(badRateLimit)('rateLimit refuses %s', async (_what, options, option) => {
    const fw = await framework(name);
    await expectInvalid(() => fw.rateLimit(options), option);
    expect(() => fw.rateLimit(options)).toThrow(/^rateLimit: /);
  });

  it.each(badWithLock)('withLock refuses %s', async (_what, key, options, option) => {
    const fw = await framework(name);
    await expectInvalid(() => fw.withLock(key, options), option);
    expect(() => fw.withLock(key, options)).toThrow(/^withLock: /);
  });

  it('accepts every documented form', async () => {
    const fw = await framework(name);
    const ok: unknown[] = [
      fw.rateLimit({ capacity: 1, rate: '30/min' }),
      fw.rateLimit({ capacity: 0.5, rate: 1, cost: 0.5 }),
      fw.rateLimit({ capacity: 3, rate: '100/h', redis, key: 'static', cost: 2, headers: false, policy: 'a "quoted" \\ name' }),
      fw.rateLimit({ bucket: new TokenBucket(base), key: async () => undefined, cost: async () => 1, onStoreError: 'closed' }),
      fw.rateLimit({ ...base, onStoreError: 'open', handler: () => undefined, key: undefined, policy: undefined }),
      fw.rateLimit({ ...base, redis, onStoreState: () => undefined }),
      fw.withLock(() => 'k'),
      fw.withLock(async () => undefined, { redis, ttl: 1_000, wait: 0, autoExtend: false }),
      fw.withLock(() => 'k', { redis: [redis, redis2, redis3], wait: 500 }),
      fw.withLock(() => 'k', { locker: new MemoryLock(), ttl: undefined }),
    ];
    for (const mw of ok) expect(typeof mw).toBe('function');
  });
});
