// Property tests of TokenBucket: the memory and Redis buckets against an independent continuous-bucket model over
// random operation sequences, the Lua script against the JavaScript arithmetic, and the never-over-admit bound.
import fc from 'fast-check';
import type { ChainableCommander, Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TokenBucket, type Decision } from '../../packages/core/src/index.js';
import { EXPIRY_GRID_US, TAKE } from '../../packages/core/src/rate-limit/bucket.lua.js';
import { decide, gcraParams } from '../../packages/core/src/rate-limit/gcra.js';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { uniquePrefix } from '../core/helpers.js';

afterAll(async () => {
  await stopAll();
});

/**
 * The reference: a continuous bucket, tokens = min(capacity, tokens + rate × dt), written with none of the GCRA's
 * machinery. To keep it exact, tokens are counted in units of 1 / `interval` (µs of refill), so a bucket whose
 * `interval` (µs per token) is a whole number and whose costs are multiples of 1/2 (with an even `interval`) is all
 * integer arithmetic.
 */
class ModelBucket {
  private readonly levels = new Map<string, number>();

  constructor(
    readonly capacity: number,
    readonly interval: number,
  ) {}

  private get full(): number {
    return this.capacity * this.interval;
  }

  /** Lets `dt` µs pass for every bucket. */
  advance(dt: number): void {
    for (const [key, level] of this.levels) this.levels.set(key, Math.min(this.full, level + dt));
  }

  decide(key: string, cost: number, commit: boolean): Decision {
    const level = this.levels.get(key) ?? this.full;
    const need = cost * this.interval;
    const allowed = level >= need;
    const after = allowed ? level - need : level;
    if (commit && allowed) this.levels.set(key, after);
    return {
      allowed,
      limit: this.capacity,
      remaining: Math.floor(after / this.interval),
      retryAfter: allowed ? 0 : Math.ceil((need - level) / 1_000),
      resetAfter: Math.ceil((this.full - after) / 1_000),
    };
  }

  reset(key: string): void {
    this.levels.delete(key);
  }
}

type Op = { kind: 'take' | 'peek' | 'reset'; key: string; cost: number; advance: number };

interface Scenario {
  capacity: number;
  interval: number;
  ops: Op[];
}

/**
 * Buckets with an even whole-µs interval and a capacity in halves, and op sequences on two keys with costs in halves
 * up to the capacity and time steps scaled to the interval (0, a fraction of a token, or up to a refill and more).
 */
function scenarios(intervals: fc.Arbitrary<number>, withTime: boolean): fc.Arbitrary<Scenario> {
  return fc
    .record({ halves: fc.integer({ min: 1, max: 40 }), interval: intervals })
    .chain(({ halves, interval }) => {
      const capacity = halves / 2;
      const op = fc.record({
        kind: fc.constantFrom<Op['kind']>('take', 'take', 'take', 'peek', 'reset'),
        key: fc.constantFrom('a', 'b'),
        cost: fc.integer({ min: 1, max: halves }).map((h) => h / 2),
        advance: withTime
          ? fc.oneof(
              fc.constant(0),
              fc.integer({ min: 0, max: interval }),
              fc.integer({ min: 0, max: Math.ceil(capacity * interval * 1.5) }),
            )
          : fc.constant(0),
      });
      return fc.record({ capacity: fc.constant(capacity), interval: fc.constant(interval), ops: fc.array(op, { maxLength: 40, size: 'max' }) });
    });
}

const evenInterval = (min: number, max: number) => fc.integer({ min: min / 2, max: max / 2 }).map((x) => 2 * x);

describe('TokenBucket in memory against the continuous model', () => {
  it('decides every take, peek and reset exactly as the model, at any rate and time step', async () => {
    await fc.assert(
      fc.asyncProperty(
        // 2 µs (500 000/s) up to 2 h per token.
        scenarios(fc.oneof(evenInterval(2, 20_000), evenInterval(20_000, 7_200_000_000)), true),
        async ({ capacity, interval, ops }) => {
          let micros = 1_700_000_000_000_000;
          const bucket = new TokenBucket({ capacity, rate: 1e6 / interval, clock: () => micros / 1_000 });
          const model = new ModelBucket(capacity, interval);
          for (const op of ops) {
            micros += op.advance;
            model.advance(op.advance);
            if (op.kind === 'reset') {
              await bucket.reset(op.key);
              model.reset(op.key);
            } else {
              const got = await bucket[op.kind](op.key, op.cost);
              expect(got).toEqual(model.decide(op.key, op.cost, op.kind === 'take'));
            }
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe('TokenBucket waits', () => {
  it('means what retryAfter and resetAfter say: waiting that long is enough, 1 ms less is not', async () => {
    await fc.assert(
      fc.asyncProperty(
        scenarios(fc.oneof(evenInterval(2, 20_000), evenInterval(20_000, 7_200_000_000)), true),
        fc.integer({ min: 1, max: 40 }),
        async ({ capacity, interval, ops }, wantHalves) => {
          const want = Math.min(wantHalves / 2, capacity);
          // Two buckets with the same history; then one waits the advertised time, the other 1 ms less.
          const clocks = [1_700_000_000_000_000, 1_700_000_000_000_000];
          const [a, b] = clocks.map((_, i) => new TokenBucket({ capacity, rate: 1e6 / interval, clock: () => clocks[i]! / 1_000 }));
          for (const op of ops) {
            for (const [i, bucket] of [a!, b!].entries()) {
              clocks[i]! += op.advance;
              if (op.kind === 'reset') await bucket.reset(op.key);
              else await bucket[op.kind](op.key, op.cost);
            }
          }
          const d = await a!.peek('a', want);
          if (!d.allowed) {
            clocks[0]! += d.retryAfter * 1_000;
            clocks[1]! += (d.retryAfter - 1) * 1_000;
            expect((await a!.peek('a', want)).allowed).toBe(true);
            expect((await b!.peek('a', want)).allowed).toBe(false);
          }
          // resetAfter is counted after the decision; a denied peek takes nothing, so it is the wait until full.
          // (The clocks may differ by now: each bucket waits what it was told, the second 1 ms less.)
          const [fullA, fullB] = [await a!.peek('a', capacity), await b!.peek('a', capacity)];
          if (!fullA.allowed) {
            clocks[0]! += fullA.resetAfter * 1_000;
            expect((await a!.peek('a', capacity)).allowed).toBe(true);
          }
          if (!fullB.allowed) {
            clocks[1]! += (fullB.resetAfter - 1) * 1_000;
            expect((await b!.peek('a', capacity)).allowed).toBe(false);
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});

/** `source` with its one read of the server clock replaced by `clock` (Lua), so the server can be shown any time. */
function pinClock(source: string, clock: string): string {
  const clockRead = "redis.call('TIME')";
  expect(source.split(clockRead)).toHaveLength(2);
  return source.replace(clockRead, clock);
}

/** Bucket parameters and a server time (µs) for the tests of the Lua against the JavaScript arithmetic. */
const luaBucket = {
  capacity: fc.oneof(fc.integer({ min: 1, max: 1_000 }), fc.double({ min: 0.01, max: 1e6, noNaN: true })),
  rate: fc.oneof(fc.double({ min: 1e-6, max: 1e6, noNaN: true }), fc.integer({ min: 1, max: 1_000 })),
  now: fc.integer({ min: 1_600_000_000_000_000, max: 2_000_000_000_000_000 }),
};

/**
 * Queues on `tx` a bucket key holding `tat` (µs, undefined: no key) as of server time `now`, as TAKE leaves it: expiring
 * at the end of the TAT's second. A key whose second has passed is no key.
 */
function presetBucket(tx: ChainableCommander, key: string, tat: number | undefined, now: number): void {
  if (tat === undefined || expiresIn(tat, now) <= 0) tx.del(key);
  else tx.set(key, String(tat), 'PX', expiresIn(tat, now));
}

/**
 * The expiry (ms from server time `now`, µs) TAKE gives a key holding `tat`: to the end of the grid second in which
 * `tat` lies, and a ms more (see TAKE).
 */
function expiresIn(tat: number, now: number): number {
  return (Math.floor(tat / EXPIRY_GRID_US) + 1) * (EXPIRY_GRID_US / 1_000) - Math.floor(now / 1_000) + 1;
}

/** A key TAKE wrote for a TAT of `tat`: that TAT, expiring at the end of its second (less a transaction's ms). */
function expectWritten(value: string | null, pttl: number, tat: number, now: number): void {
  expect(value).toBe(String(tat));
  expect(pttl).toBeLessThanOrEqual(expiresIn(tat, now));
  expect(pttl).toBeGreaterThanOrEqual(expiresIn(tat, now) - 5);
}

/** Whether a bucket is one TokenBucket accepts: at least 1 µs of refill, at most 2^51 µs. */
function burstFits({ capacity, rate }: { capacity: number; rate: number }): boolean {
  const burst = capacity * gcraParams(capacity, rate).interval;
  return burst >= 1 && burst <= 2 ** 51;
}

describe('TokenBucket on Redis', () => {
  let node: RedisNode;
  let redis: Redis;

  beforeAll(async () => {
    node = await startRedis();
    redis = node.client();
  });

  it('decides like the model and the in-memory twin when no token can come back during the run (one per 17 min to 3 h)', async () => {
    await fc.assert(
      fc.asyncProperty(scenarios(evenInterval(1_000_000_000, 10_000_000_000), false), async ({ capacity, interval, ops }) => {
        const bucket = new TokenBucket({ capacity, rate: 1e6 / interval, redis, prefix: uniquePrefix('prop') });
        // The in-memory twin on a clock that stands still, and the model.
        const twin = new TokenBucket({ capacity, rate: 1e6 / interval, clock: () => 1_700_000_000_000 });
        const model = new ModelBucket(capacity, interval);
        const started = performance.now();
        // Longest round trip of a take so far: a refusal answered from the deny cache counts the refill time from when
        // the take it remembers was sent, so its ms fields may run ahead of Redis's by up to that take's round trip.
        let roundTrip = 0;
        for (const op of ops) {
          if (op.kind === 'reset') {
            await bucket.reset(op.key);
            await twin.reset(op.key);
            model.reset(op.key);
            continue;
          }
          const asked = performance.now();
          const got = await bucket[op.kind](op.key, op.cost);
          roundTrip = Math.max(roundTrip, performance.now() - asked);
          const want = model.decide(op.key, op.cost, op.kind === 'take');
          expect(await twin[op.kind](op.key, op.cost)).toEqual(want);
          // Half a token takes over 8 min to come back, so whole-token counts are exact; the ms counts shrink
          // only by the real time this run has taken.
          expect({ allowed: got.allowed, limit: got.limit, remaining: got.remaining }).toEqual({
            allowed: want.allowed,
            limit: want.limit,
            remaining: want.remaining,
          });
          const slack = performance.now() - started + roundTrip + 1;
          for (const field of ['retryAfter', 'resetAfter'] as const) {
            expect(got[field]).toBeLessThanOrEqual(want[field]);
            expect(got[field]).toBeGreaterThanOrEqual(want[field] - slack);
          }
          if (got.allowed) expect(got.retryAfter).toBe(0);
        }
      }),
      { numRuns: 60 },
    );
  });

  it('never admits more than capacity + rate × elapsed at fast rates, and keeps every decision consistent', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.record({
          capacity: fc.integer({ min: 1, max: 10 }),
          rate: fc.integer({ min: 200, max: 5_000 }),
          ops: fc.array(fc.record({ cost: fc.integer({ min: 1, max: 10 }), peek: fc.boolean() }), { minLength: 20, maxLength: 120 }),
        }),
        async ({ capacity, rate, ops }) => {
          const bucket = new TokenBucket({ capacity, rate, redis, prefix: uniquePrefix('fast') });
          const [s0, us0] = await redis.time();
          let admitted = 0;
          for (const op of ops) {
            const cost = Math.min(op.cost, capacity);
            const d = await bucket[op.peek ? 'peek' : 'take']('k', cost);
            if (d.allowed && !op.peek) admitted += cost;
            expect(d.limit).toBe(capacity);
            expect(d.remaining).toBeGreaterThanOrEqual(0);
            // Intervals are whole µs, rounded up: a token may take up to 1 µs longer than 1 / rate.
            expect(d.resetAfter).toBeLessThanOrEqual(Math.ceil((capacity * 1_000) / rate + capacity / 1_000));
            if (d.allowed) {
              expect(d.retryAfter).toBe(0);
              expect(d.remaining).toBeLessThanOrEqual(capacity - cost);
            } else {
              expect(d.remaining).toBeLessThan(cost);
              expect(d.retryAfter).toBeGreaterThan(0);
              expect(d.retryAfter).toBeLessThanOrEqual(Math.ceil((cost * 1_000) / rate + cost / 1_000));
            }
          }
          const [s1, us1] = await redis.time();
          const elapsed = Number(s1) - Number(s0) + (Number(us1) - Number(us0)) / 1e6;
          expect(admitted).toBeLessThanOrEqual(capacity + rate * elapsed);
        },
      ),
      { numRuns: 25 },
    );
  });

  it('runs the same arithmetic in Lua as in JavaScript, number for number, and keeps the key until the bucket is full', async () => {
    const source = pinClock(TAKE.source, '{ARGV[5], ARGV[6]}');
    const key = `${uniquePrefix('lua')}{k}`;
    await fc.assert(
      fc.asyncProperty(
        fc
          .record({
            ...luaBucket,
            costShare: fc.double({ min: 0, max: 1, noNaN: true }),
            // Up to one burst ahead of the clock is a normal bucket; further ahead, the clock went back.
            tatShare: fc.option(fc.oneof(fc.double({ min: -2, max: 1, noNaN: true }), fc.double({ min: 1, max: 1e3, noNaN: true })), {
              nil: undefined,
            }),
            commit: fc.boolean(),
          })
          .filter(burstFits),
        async ({ capacity, rate, now, costShare, tatShare, commit }) => {
          const params = gcraParams(capacity, rate);
          const cost = Math.max(Number.MIN_VALUE, costShare * capacity);
          const burst = params.burst;
          let tat = tatShare === undefined ? undefined : Math.floor(now + tatShare * burst);
          // One transaction, so the key cannot expire (on the real clock) between the script and the reads.
          const tx = redis.multi();
          presetBucket(tx, key, tat, now);
          tx.get(key);
          tx.pttl(key);
          tx.eval(source, 1, key, params.burst, params.interval, commit ? '1' : '0', cost, Math.floor(now / 1e6), now % 1e6);
          tx.get(key);
          tx.pttl(key);
          const results = (await tx.exec())!.map(([error, value]) => {
            if (error) throw error;
            return value;
          });
          const [before, pttlBefore, reply, stored, pttl] = results.slice(1) as [string | null, number, number[], string | null, number];
          if (before === null) tat = undefined;
          // The script reports how far the TAT lay ahead of its clock, and the store decides on that with decide(): the
          // same decision as decide() on the times relative to the clock, and the script wrote exactly what it says.
          const { decision, store: ahead } = decide(params, tat === undefined ? undefined : tat - now, 0, cost, commit);
          const store = ahead === undefined ? undefined : now + ahead;
          expect(decide(params, reply[0]!, 0, cost, commit).decision).toEqual(decision);
          expect(reply[1]).toBe(store ?? 0);
          if (store !== undefined) {
            // The key lives at least until the bucket is full again, and at most to the end of that second.
            expectWritten(stored, pttl, store, now);
            if (decision.allowed) expect(Math.ceil((store - now) / 1_000)).toBe(decision.resetAfter);
          } else {
            expect(stored).toBe(before);
            expect(pttl).toBeLessThanOrEqual(pttlBefore);
          }
        },
      ),
      { numRuns: 400 },
    );
  });

  it("runs takes merged in TAKE's batch form as TAKE runs them one by one, keys repeated included", async () => {
    // The clock: the last two arguments, after every take's cost.
    const source = pinClock(TAKE.batch!.script.source, '{ARGV[#ARGV - 1], ARGV[#ARGV]}');
    const prefix = uniquePrefix('luabatch');
    await fc.assert(
      fc.asyncProperty(
        fc
          .record({
            ...luaBucket,
            commit: fc.boolean(),
            // The state of four buckets (as in the test above), then takes on them in any order, some on the same one.
            tats: fc.array(fc.option(fc.double({ min: -2, max: 3, noNaN: true }), { nil: undefined }), {
              minLength: 4,
              maxLength: 4,
            }),
            takes: fc.array(fc.record({ bucket: fc.integer({ min: 0, max: 3 }), costShare: fc.double({ min: 0, max: 1, noNaN: true }) }), {
              minLength: 1,
              maxLength: 12,
            }),
          })
          .filter(burstFits),
        async ({ capacity, rate, now, commit, tats, takes }) => {
          const params = gcraParams(capacity, rate);
          const burst = params.burst;
          const keys = [0, 1, 2, 3].map((i) => `${prefix}{k${i}}`);
          const preset = tats.map((share) => (share === undefined ? undefined : now + Math.floor(share * burst)));
          // A key whose second has passed is no key.
          preset.forEach((tat, i) => {
            if (tat !== undefined && expiresIn(tat, now) <= 0) preset[i] = undefined;
          });
          // What each bucket holds, relative to the clock, as TAKE would leave it after each take in turn.
          const ahead = preset.map((tat) => (tat === undefined ? undefined : tat - now));
          const written = new Map<number, number>();
          const costs = takes.map((t) => Math.max(Number.MIN_VALUE, t.costShare * capacity));
          const expected = takes.map((t, i) => {
            const { decision, store } = decide(params, ahead[t.bucket], 0, costs[i]!, commit);
            if (store !== undefined) {
              ahead[t.bucket] = store;
              written.set(t.bucket, now + store);
            }
            return { decision, stored: store === undefined ? 0 : now + store };
          });
          const tx = redis.multi();
          preset.forEach((tat, i) => presetBucket(tx, keys[i]!, tat, now));
          const args = [params.burst, params.interval, commit ? '1' : '0', ...costs, Math.floor(now / 1e6), now % 1e6];
          tx.eval(source, takes.length, ...takes.map((t) => keys[t.bucket]!), ...args);
          for (const k of keys) tx.get(k).pttl(k);
          const results = (await tx.exec())!.map(([error, value]) => {
            if (error) throw error;
            return value;
          });
          const reply = results[results.length - 9] as number[];
          expect(reply).toHaveLength(2 * takes.length);
          // Each written key holds its last TAT, with the expiry of that TAT's second.
          for (const [i, tat] of written) expectWritten(results[results.length - 8 + 2 * i] as string | null, results[results.length - 7 + 2 * i] as number, tat, now);
          expected.forEach(({ decision, stored }, i) => {
            expect(decide(params, reply[2 * i]!, 0, costs[i]!, false).decision).toEqual(decision);
            expect(reply[2 * i + 1]).toBe(stored);
          });
        },
      ),
      { numRuns: 300 },
    );
  });
});
