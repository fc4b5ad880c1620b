// Every invalid value of every locker option, constructor and per call, fails at once with a TypeError or RangeError
// naming the option, before anything is sent to Redis (the clients here never connect).
import { once } from 'node:events';
import { Cluster, Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { MemoryLock, RedisLock, Redlock, TokenBucket, type Locker } from '../../packages/core/src/index.js';
import { expectInvalid, until, within } from './helpers.js';

// lazyConnect: constructing and validating never opens a connection; a call that got past validation would try to
// connect and stay pending, which expectInvalid reports.
const clients: Redis[] = [];
function client(): Redis {
  const c = new Redis({ lazyConnect: true, host: '127.0.0.1', port: 1 });
  c.on('error', () => undefined);
  clients.push(c);
  return c;
}
const five = (): Redis[] => Array.from({ length: 5 }, client);

const clusters: Cluster[] = [];
afterAll(() => {
  for (const c of [...clients, ...clusters]) c.disconnect();
});

const NOT_NUMBERS: unknown[] = ['100', null, true, {}, [], () => 1, Symbol('x'), 10n];
/** Bad values for a whole, positive number of ms. */
const BAD_POSITIVE_MS: unknown[] = [0, -1, 1.5, NaN, Infinity, -Infinity, 2 ** 31, Number.MAX_SAFE_INTEGER + 2, ...NOT_NUMBERS];
/** Bad values for a whole number of ms that may be 0. */
const BAD_MS: unknown[] = [-1, -0.5, 1.5, NaN, Infinity, 2 ** 31, ...NOT_NUMBERS];
const NOT_STRINGS: unknown[] = [5, null, true, {}, [], () => 'x', Symbol('x')];
const NOT_FUNCTIONS: unknown[] = [5, 'fn', null, true, {}, []];

/** Options every locker constructor takes, with their bad values. */
const SHARED: [string, unknown[]][] = [
  ['ttl', BAD_POSITIVE_MS],
  ['wait', BAD_MS],
  ['onError', NOT_FUNCTIONS],
  // A '{' in the prefix would open a Cluster hash tag overriding the one hasp gives each key, or let names of different
  // prefixes collide (MemoryLock refuses it too, so code moving to Redis meets no new error).
  ['prefix', [...NOT_STRINGS, 'app{x}:', '{a}', 'app{']],
];
// A lease no longer than the clock-drift allowance (1 % + 2 ms) would end as it began.
const REDIS_ONLY: [string, unknown[]][] = [
  ['timeout', BAD_POSITIVE_MS],
  ['ttl', [1, 2]],
];
const REDLOCK_ONLY: [string, unknown[]][] = [
  ['driftFactor', [-0.01, 1, 1.5, NaN, Infinity, ...NOT_NUMBERS]],
  ['quorum', [0, 1, 2, 6, 3.5, NaN, Infinity, ...NOT_NUMBERS]], // 5 nodes: a majority (3) to 5
  ['nodeTimeout', BAD_POSITIVE_MS],
  ['retryCount', [-1, 1.5, NaN, Infinity, ...NOT_NUMBERS]],
  ['retryDelay', BAD_MS],
];
// A clock must answer finite epoch ms: a Date, NaN or a string would make deadlines that never come.
const BAD_CLOCKS = [() => new Date(), () => NaN, () => '1700000000000', () => undefined, () => 10n, () => Infinity];
const MEMORY_ONLY: [string, unknown[]][] = [['clock', [...NOT_FUNCTIONS, ...BAD_CLOCKS]]];

const constructors: [string, (options: unknown) => unknown, [string, unknown[]][]][] = [
  ['MemoryLock', (o) => new MemoryLock(o as never), [...SHARED, ...MEMORY_ONLY]],
  ['RedisLock', (o) => new RedisLock(client(), o as never), [...SHARED, ...REDIS_ONLY]],
  ['Redlock', (o) => new Redlock(five(), o as never), [...SHARED, ...REDIS_ONLY, ...REDLOCK_ONLY]],
];

describe.each(constructors)('new %s(options)', (_name, make, options) => {
  it.each(options)('rejects every bad %s, naming it', async (option, bad) => {
    for (const value of bad) await expectInvalid(() => make({ [option]: value }), option);
  });

  it('rejects an unknown or misspelled option by its name, and options that are not an object', async () => {
    await expectInvalid(() => make({ ttl: 5_000, wiat: 100 }), 'wiat');
    await expectInvalid(() => make({ TTL: 5_000 }), 'TTL');
    for (const value of [5, 'ttl', true]) await expectInvalid(() => make(value), 'options');
  });
});

describe('MemoryLock clock gone bad', () => {
  it('fails the call naming clock, instead of waiting for a deadline that never comes', async () => {
    let now = 1_000;
    const locks = new MemoryLock({ clock: () => now });
    const held = await locks.acquire('k', { ttl: 10_000 });
    now = NaN;
    for (const attempt of [locks.tryAcquire('k'), locks.acquire('k', { wait: 0 }), locks.acquire('k', { wait: 1_000 })]) {
      await expect(attempt).rejects.toThrow(/^clock must return a finite number of ms, got NaN$/);
    }
    now = 2_000;
    expect(await held.release()).toBe(true);
  });
});

describe('MemoryLock clock going bad later', () => {
  // Readings after a call started are not checked (a throw from a timer would have no caller): a lease ends, an
  // auto-extension gives up, and no lock is left held without a lease, however the clock answers.
  it('ends a lease by its timer without a throw when the clock answers NaN', async () => {
    let now = 1_000;
    const locks = new MemoryLock({ clock: () => now });
    const lease = await locks.acquire('k', { ttl: 50 });
    const { signal } = lease;
    now = NaN;
    await within(once(signal, 'abort'), 2_000, 'the lease to end');
  });

  it('keeps extending a using() lease when the clock answers undefined during auto-extension, and settles with fn’s value', async () => {
    let now: number | undefined = 1_000;
    const locks = new MemoryLock({ clock: () => now as number });
    const result = locks.using(
      'k',
      async (lease) => {
        const before = lease.expiresAt;
        now = undefined;
        // Counted on by the real clock from the last good reading: the auto-extension keeps the lease.
        await until(() => lease.expiresAt > before, 2_000, 'an extension on the bad clock');
        expect(lease.signal.aborted).toBe(false);
        return 'done';
      },
      { ttl: 40 },
    );
    expect(await within(result, 5_000, 'using')).toBe('done');
  });

  const bad = { NaN: () => NaN, 'a throw': () => { throw new Error('clock broke'); } };

  it.each(
    (['NaN', 'a throw'] as const).flatMap((how) => Array.from({ length: 12 }, (_, i) => [how, i + 1] as const)),
  )('leaves no key held past its ttl when the clock answers %s on its reading %i of an acquire (the lease never released)', async (how, n) => {
    // (Reading 1 is the constructor's; the acquire's come after.)
    let readings = 0;
    let t = 1_000;
    const locks = new MemoryLock({ clock: () => (++readings === n + 1 ? bad[how]() : (t += 1)) });
    const acquired = await locks.acquire('k', { ttl: 60_000 }).then(
      () => undefined,
      (error: unknown) => error as Error,
    );
    readings = -Infinity;
    if (acquired !== undefined) expect(acquired.message).toMatch(/^clock (must return a finite number of ms, got NaN|threw: clock broke)$/);
    // Past the ttl on the clock (a lease made on a bad reading counted on from the last good one).
    t += 120_000;
    const after = await locks.tryAcquire('k');
    expect(after).not.toBeNull();
    await after!.release();
  });

  it.each([2, 3, 4, 5, 6, 7, 8])(
    'never lets a lease outlast the store’s end for it when the clock throws on readings %i and the next of an acquire, then comes back lower',
    async (k) => {
      // (Reading 1 is the constructor's.) The clock stands at 1,000 until moved by hand: the time given for its bad
      // readings (counted on by the real clock) lies a little above it.
      let readings = 0;
      let t = 1_000;
      const locks = new MemoryLock({
        clock: () => {
          readings++;
          if (readings === k + 1 || readings === k + 2) throw new Error('clock broke');
          return t;
        },
      });
      const a = await locks.acquire('k', { ttl: 10_000 }).catch(() => undefined);
      readings = -Infinity;
      if (a === undefined) return; // refused where it started
      for (t = 10_990; t <= 11_050; t++) {
        const b = await locks.tryAcquire('k', { ttl: 10_000 });
        if (b === null) continue;
        // Let in: the first lease must be over by then.
        expect(a.expiresAt).toBeLessThanOrEqual(t);
        await b.release();
        return;
      }
      throw new Error('the lock was never free again');
    },
  );

  it('refuses a call naming clock, and throws nothing, when the clock throws a value that cannot even be shown', async () => {
    let evil = false;
    const locks = new MemoryLock({
      clock: () => {
        if (!evil) return 1_000;
        const error = new Error();
        Object.defineProperty(error, 'message', {
          get() {
            throw new Error('message getter');
          },
        });
        throw error;
      },
    });
    const lease = await locks.acquire('k', { ttl: 50 });
    evil = true;
    expect(lease.signal.aborted).toBe(false);
    await expect(locks.tryAcquire('other')).rejects.toThrow(/^clock threw: an error that cannot be shown$/);
    await within(once(lease.signal, 'abort'), 2_000, 'the lease to end');
  });

  it('ends a lease by its timer, without a throw, when the clock throws', async () => {
    let broken = false;
    const locks = new MemoryLock({
      clock: () => {
        if (broken) throw new Error('clock broke');
        return 1_000;
      },
    });
    const lease = await locks.acquire('k', { ttl: 50 });
    const { signal } = lease;
    broken = true;
    // Counted on by the real clock from the last good reading: the lease ends after its 50 ms.
    await within(once(signal, 'abort'), 2_000, 'the lease to end');
  });
});

describe('locker clients', () => {
  it('RedisLock needs an ioredis client', async () => {
    for (const value of [undefined, null, {}, 'redis://localhost', 6379, { evalsha() {} }]) {
      await expectInvalid(() => new RedisLock(value as never), 'redis');
    }
  });

  it('leaves what looks like credentials out of any option value it shows', () => {
    const shown = [
      'redis://u:hunter2@h:1',
      ' rediss://:hunter2@h',
      'default:hunter2@cache:6379',
      'redis://h:1?password=hunter2',
      '/tmp/r.sock?db=1&pass=hunter2',
      'redis://default:hunt/er2@10.0.0.5:6379',
      'redis://h:6379/0#password=hunter2',
      '/tmp/r.sock?requirepass=hunter2',
      'h:6379?auth=hunter2',
      'localhost:6379,password=hunter2',
      'host=h port=6379 password=hunter2',
      'PASSWORD=hunter2',
      '{"host":"h","password":"hunter2"}',
      'h?pw=hunter2',
      'redis%3A%2F%2Fu%3Ahunter2%40h',
      '{"pw":"hunter2"}',
    ];
    for (const value of shown) {
      expect(() => new MemoryLock({ ttl: value as never })).toThrow(/^ttl must be a/);
      expect(() => new MemoryLock({ ttl: value as never })).not.toThrow(/hunter2/);
    }
  });

  it('shows a bad value in time linear in its length, however it is made (values from a request reach it)', () => {
    const started = performance.now();
    for (const value of ['?pass'.repeat(200_000), `${'a'.repeat(1_000_000)}@`, '?'.repeat(1_000_000)]) {
      expect(() => new MemoryLock({ ttl: value as never })).toThrow(/^ttl must be a number, got (a string of \d+ characters|")/);
    }
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it('still shows ordinary values', () => {
    expect(() => new MemoryLock({ ttl: '5000' as never })).toThrow('ttl must be a number, got "5000"');
  });

  it('never puts the password of a Redis URL passed for a client into the message, and says what to pass', () => {
    const url = 'redis://default:hunter2@cache.internal:6379/0';
    const messages: string[] = [];
    for (const make of [
      () => new RedisLock(url as never),
      () => new Redlock([url] as never),
      () => new Redlock([client(), client(), `rediss://:p%40ss@h/0`] as never),
      () => new TokenBucket({ capacity: 1, rate: 1, redis: url as never }),
      () => new Redlock('redis://default:hunt/er2@10.0.0.5:6379' as never),
    ]) {
      try {
        make();
      } catch (error) {
        messages.push((error as Error).message);
      }
    }
    expect(messages).toHaveLength(5);
    for (const m of messages) {
      expect(m).not.toMatch(/hunter2|hunt\/er2|p%40ss/);
      expect(m).toMatch(/must be (an ioredis Redis or Cluster instance, got a string \(for a URL, pass new Redis\(url\)\)|a non-empty array of ioredis clients, got a string of \d+ characters \(not shown: it may hold credentials\))$/);
    }
  });

  it('refuses a Cluster client whose keyPrefix opens an empty hash tag (every script would fail CROSSSLOT), naming the option', async () => {
    const cluster = (keyPrefix: string) => {
      const c = new Cluster([{ host: '127.0.0.1', port: 1 }], { lazyConnect: true, keyPrefix });
      c.on('error', () => undefined);
      clusters.push(c);
      return c;
    };
    for (const keyPrefix of ['x{}', '{}', 'a{}b{c}']) {
      await expectInvalid(() => new RedisLock(cluster(keyPrefix)), 'redis');
      await expectInvalid(() => new Redlock([client(), cluster(keyPrefix), client()]), 'clients[1]');
    }
    // With hasp's prefix too: a keyPrefix left open and a prefix that closes it at once.
    await expectInvalid(() => new RedisLock(cluster('x{'), { prefix: '}lock:' }), 'redis');
    await expectInvalid(() => new Redlock([client(), cluster('a}{')], { prefix: '}' }), 'clients[1]');
    // A complete tag puts every key in one slot, which works; so does a tag that hasp's names close.
    for (const keyPrefix of ['app:', 'app{x}:', 'x{']) new RedisLock(cluster(keyPrefix)).close();
    new RedisLock(cluster('x{'), { prefix: 'a}' }).close();
  });

  it('Redlock needs a non-empty array of distinct ioredis clients', async () => {
    for (const value of [undefined, null, [], {}, client(), 'redis://localhost']) {
      await expectInvalid(() => new Redlock(value as never), 'clients');
    }
    await expectInvalid(() => new Redlock([client(), {} as never, client()]), 'clients[1]');
    await expectInvalid(() => new Redlock([client(), null as never]), 'clients[1]');
    const c = client();
    await expectInvalid(() => new Redlock([c, client(), c]), 'clients');
  });
});

const lockers: [string, () => Locker, number[]][] = [
  ['MemoryLock', () => new MemoryLock(), []],
  // No longer than the clock-drift allowance: the lease would end as it began.
  ['RedisLock', () => new RedisLock(client()), [1, 2]],
  ['Redlock', () => new Redlock(five()), [1, 2]],
];

/** Per-call options with their bad values. */
const CALL: [string, unknown[]][] = [
  ['ttl', BAD_POSITIVE_MS],
  ['wait', BAD_MS],
  ['owner', ['', ...NOT_STRINGS]],
  ['signal', [5, 'abort', true, {}, { aborted: false }, new AbortController()]],
];

describe.each(lockers)('%s calls', (_name, make, tooShort) => {
  it.each(CALL)('acquire, tryAcquire and using reject every bad %s at once, naming it', async (option, bad) => {
    const locks = make();
    for (const value of option === 'ttl' ? [...bad, ...tooShort] : bad) {
      const options = { [option]: value } as never;
      await expectInvalid(() => locks.acquire('k', options), option);
      await expectInvalid(() => locks.tryAcquire('k', options), option);
      await expectInvalid(() => locks.using('k', async () => undefined, options), option);
    }
  });

  it('using rejects a bad autoExtend or fn, and every call a bad key, naming them', async () => {
    const locks = make();
    for (const value of [1, 'true', null, {}]) {
      await expectInvalid(() => locks.using('k', async () => undefined, { autoExtend: value as never }), 'autoExtend');
    }
    for (const value of [undefined, null, 'fn', {}]) await expectInvalid(() => locks.using('k', value as never), 'fn');
    for (const key of ['', undefined, null, 5, {}, ['k'], Symbol('k')]) {
      await expectInvalid(() => locks.acquire(key as never), 'key');
      await expectInvalid(() => locks.tryAcquire(key as never), 'key');
      await expectInvalid(() => locks.using(key as never, async () => undefined), 'key');
    }
    for (const value of [5, 'x', true]) await expectInvalid(() => locks.acquire('k', value as never), 'options');
  });

  it('rejects a misspelt or unknown per-call option by its name (autoExtend is using’s alone), and takes the right ones', async () => {
    const locks = make();
    for (const options of [{ ttll: 5_000 }, { TTL: 5_000 }, { wait: 0, timeout: 100 }, { autoExtend: false }]) {
      const name = Object.keys(options).at(-1)!;
      await expectInvalid(() => locks.acquire('k', options as never), name);
      await expectInvalid(() => locks.tryAcquire('k', options as never), name);
    }
    await expectInvalid(() => locks.using('k', async () => undefined, { autoextend: false } as never), 'autoextend');
  });
});

describe('per-call options that are right', () => {
  it('are taken, an option set to undefined counting as not given (as in the constructors)', async () => {
    const locks = new MemoryLock();
    const lease = await locks.acquire('k', { ttl: 5_000, wait: 0, owner: 'o', signal: new AbortController().signal, other: undefined } as never);
    await lease.release();
    expect(await locks.using('k', async () => 'ran', { ttl: 5_000, autoExtend: false, owner: 'o', wait: 10 })).toBe('ran');
  });
});

describe('lease.extend', () => {
  it('rejects a bad ttl at once, naming it, and the lease stays held', async () => {
    const locks = new MemoryLock();
    const lease = await locks.acquire('k');
    for (const value of [0, -1, 1.5, NaN, Infinity, 2 ** 31, '100', null, true]) {
      await expectInvalid(() => lease.extend(value as never), 'ttl');
    }
    if (lease.signal.aborted) throw new Error('a rejected extend must not affect the lease');
    await lease.release();
  });
});

describe('lockers on a Sentinel client', () => {
  it('warn once per process when the client lacks failoverDetector, which keeps it on a demoted master', async () => {
    const sentinel = (failoverDetector?: boolean) =>
      new Redis({ sentinels: [{ host: '127.0.0.1', port: 1 }], name: 'm', lazyConnect: true, ...(failoverDetector ? { failoverDetector } : {}) });
    const warnings: (Error & { code?: string })[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    process.on('warning', onWarning);
    const made: Locker[] = [];
    try {
      made.push(new RedisLock(sentinel(true)), new RedisLock(new Redis({ lazyConnect: true })));
      await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
      expect(warnings).toEqual([]);
      made.push(new Redlock([sentinel(), sentinel(true)]), new RedisLock(sentinel()));
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings.map((w) => w.code)).toEqual(['HASP_SENTINEL_FAILOVER_DETECTOR']);
      expect(warnings[0]!.message).toMatch(/failoverDetector: true/);
    } finally {
      process.off('warning', onWarning);
      for (const l of made) (l as RedisLock).close();
    }
  });
});
