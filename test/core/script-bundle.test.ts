// The bundle script that merges the calls of one callback: each call sees exactly its own keys and arguments (nil past
// them, as in a command of its own), answers its own reply or error, and a script the bundle cannot hold runs alone.
// This file has its own module registry (vitest isolates test files), so the scripts below are the bundle's only ones.
import { describe, expect, it } from 'vitest';
import { Script } from '../../packages/core/src/redis/script.js';
import { commandStats, privateRedis, scriptCommands, uniquePrefix } from './helpers.js';

// Made before any call, so all but LENGTHS (which reads ARGV as a whole) are bundled.
const ECHO = new Script(`return {KEYS[1] or '-', KEYS[2] or '-', ARGV[1] or '-', ARGV[2] or '-', ARGV[3] or '-'}`);
const INCR = new Script(`return redis.call('INCR', KEYS[1])`);
const BOOM = new Script(`error('boom ' .. ARGV[1])`);
const NOTHING = new Script(`return nil`);
const LENGTHS = new Script(`return {#KEYS, #ARGV}`);
const CLOCK = new Script(`local t = redis.call('TIME') return t[1] .. '.' .. t[2]`);
const SHARED_CLOCK = new Script(`local t = redis.call('TIME') return t[1] .. '.' .. t[2]`, { sharedClock: true });
// A script with a batch form (one key; a shared argument, then one of its own), which says which form answered.
const PAIR = new Script(
  `if ARGV[2] == 'fail' then return redis.error_reply('failed ' .. KEYS[1]) end
return {'one', KEYS[1], ARGV[1] .. ':' .. ARGV[2]}`,
  {
    batch: {
      source: `local out = {}
for i = 1, #KEYS do
  local mine = ARGV[1 + i]
  out[3 * i - 2] = mine == 'fail' and redis.error_reply('failed ' .. KEYS[i]) or 'many'
  out[3 * i - 1] = KEYS[i]
  out[3 * i] = ARGV[1] .. ':' .. mine
end
return out`,
      keys: 1,
      args: 2,
      shared: 1,
      width: 3,
    },
  },
);

const redis = privateRedis();

/** Runs `calls` in one callback and settles each one. */
function together(calls: (() => Promise<unknown>)[]): Promise<PromiseSettledResult<unknown>[]> {
  return Promise.allSettled(calls.map((call) => call()));
}

describe('the bundle of merged calls', () => {
  it('gives each call exactly its own keys and arguments, nil past them, in one command', async () => {
    const client = redis.node.client();
    await client.ping();
    await redis.admin.config('RESETSTAT');
    const results = await together([
      () => ECHO.run(client, ['a'], ['1']),
      () => ECHO.run(client, ['b', 'c'], ['2', 3, '4']),
      () => ECHO.run(client, [], []),
      () => ECHO.run(client, ['d'], ['', '5']),
      () => NOTHING.run(client, [], []),
    ]);
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value : r.reason))).toEqual([
      ['a', '-', '1', '-', '-'],
      ['b', 'c', '2', '3', '4'],
      ['-', '-', '-', '-', '-'],
      ['d', '-', '', '5', '-'],
      null,
    ]);
    expect(await scriptCommands(redis.admin)).toBe(1);
    client.disconnect();
  });

  it('fails a call whose script fails, alone, and keeps the effects of the calls around it', async () => {
    const client = redis.node.client();
    await client.ping();
    const prefix = uniquePrefix('bundle');
    await redis.admin.hset(`${prefix}hash`, 'f', '1');
    const [before, wrongType, boom, after] = await together([
      () => INCR.run(client, [`${prefix}n`], []),
      () => INCR.run(client, [`${prefix}hash`], []),
      () => BOOM.run(client, [], ['here']),
      () => INCR.run(client, [`${prefix}n`], []),
    ]);
    expect(before).toEqual({ status: 'fulfilled', value: 1 });
    expect(wrongType!.status).toBe('rejected');
    expect(((wrongType as PromiseRejectedResult).reason as Error).message).toMatch(/WRONGTYPE/);
    expect(boom!.status).toBe('rejected');
    expect(((boom as PromiseRejectedResult).reason as Error).message).toMatch(/boom here/);
    expect(after).toEqual({ status: 'fulfilled', value: 2 });
    client.disconnect();
  });

  it('sends a script that reads KEYS or ARGV as a whole on its own, in call order', async () => {
    const client = redis.node.client();
    await client.ping();
    const prefix = uniquePrefix('alone');
    await redis.admin.config('RESETSTAT');
    const results = await together([
      () => INCR.run(client, [`${prefix}n`], []),
      () => LENGTHS.run(client, ['x', 'y'], ['1', '2', '3']),
      () => INCR.run(client, [`${prefix}n`], []),
    ]);
    expect(results.map((r) => (r as PromiseFulfilledResult<unknown>).value)).toEqual([1, [2, 3], 2]);
    // The first INCR alone (flushed ahead of LENGTHS), LENGTHS alone, the second INCR alone.
    expect(await scriptCommands(redis.admin)).toBe(3);
    client.disconnect();
  });

  it('reads the server clock once per merged command for scripts that share it, and per call for the others', async () => {
    const client = redis.node.client();
    await client.ping();
    await redis.admin.config('RESETSTAT');
    const shared = await together(Array.from({ length: 6 }, () => () => SHARED_CLOCK.run(client, [], [])));
    expect(await scriptCommands(redis.admin)).toBe(1);
    expect((await commandStats(redis.admin, 'time')).calls).toBe(1);
    const times = (results: PromiseSettledResult<unknown>[]) => new Set(results.map((r) => (r as PromiseFulfilledResult<unknown>).value));
    expect(times(shared).size).toBe(1);
    // Each merged command reads the clock afresh.
    const later = await together(Array.from({ length: 6 }, () => () => SHARED_CLOCK.run(client, [], [])));
    expect(times(later).size).toBe(1);
    expect([...times(later)][0]).not.toBe([...times(shared)][0]);
    await redis.admin.config('RESETSTAT');
    await together(Array.from({ length: 6 }, () => () => CLOCK.run(client, [], [])));
    expect(await scriptCommands(redis.admin)).toBe(1);
    expect((await commandStats(redis.admin, 'time')).calls).toBe(6);
    client.disconnect();
  });
});

describe('the batch form of a script', () => {
  const values = (results: PromiseSettledResult<unknown>[]) =>
    results.map((r) => (r.status === 'fulfilled' ? r.value : (r.reason as Error).message));

  it('runs merged calls of one script with the same leading arguments in its batch form, each with its own reply', async () => {
    const client = redis.node.client();
    await client.ping();
    await redis.admin.config('RESETSTAT');
    const results = await together([
      () => PAIR.run(client, ['a'], ['s', '1']),
      () => PAIR.run(client, ['b'], ['s', 'fail']),
      () => PAIR.run(client, ['c'], ['s', '3']),
    ]);
    expect(values(results)).toEqual([['many', 'a', 's:1'], 'failed b', ['many', 'c', 's:3']]);
    expect(await scriptCommands(redis.admin)).toBe(1);
    client.disconnect();
  });

  it('leaves calls that differ in their leading arguments, or are mixed with other scripts, to the bundle', async () => {
    const client = redis.node.client();
    await client.ping();
    await redis.admin.config('RESETSTAT');
    const differing = await together([() => PAIR.run(client, ['a'], ['s', '1']), () => PAIR.run(client, ['b'], ['t', '2'])]);
    expect(values(differing)).toEqual([
      ['one', 'a', 's:1'],
      ['one', 'b', 't:2'],
    ]);
    const mixed = await together([() => PAIR.run(client, ['a'], ['s', '1']), () => ECHO.run(client, ['b'], ['2'])]);
    expect(values(mixed)).toEqual([
      ['one', 'a', 's:1'],
      ['b', '-', '2', '-', '-'],
    ]);
    // A call alone runs as the script itself.
    expect(await PAIR.run(client, ['a'], ['s', 'fail']).catch((error: Error) => error.message)).toBe('failed a');
    expect(await scriptCommands(redis.admin)).toBe(3);
    client.disconnect();
  });
});
