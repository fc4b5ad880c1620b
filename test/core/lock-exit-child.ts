// Child process of lock-exit.test.ts: uses RedisLock and Redlock the way an app does (plain, using with
// auto-extension, a waiting acquire, failed acquires, a lease left held, a waiter still waiting), quits its clients and
// then simply returns: the process must exit on its own. Prints one JSON line per step for the parent to check.
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { LockBusyError, LockUnavailableError, RedisLock, Redlock, type LockErrorEvent, type Locker } from '../../packages/core/src/index.js';

const report = (step: string, detail: unknown = true): void => console.log(JSON.stringify({ step, detail }));
const unhandled: string[] = [];
process.on('unhandledRejection', (reason) => {
  unhandled.push(String(reason));
  report('unhandled', String(reason));
  process.exitCode = 1;
});

const ports = (process.env.PORTS ?? '').split(',').map(Number);
const deadPort = Number(process.env.DEAD_PORT);
const host = '127.0.0.1';
// The user's clients, on ioredis's default options.
const single = new Redis({ host, port: ports[0] });
const masters = ports.map((port) => new Redis({ host, port }));
const events: LockErrorEvent[] = [];
const onError = (e: LockErrorEvent): void => {
  events.push(e);
};
const lockers: [string, Locker][] = [
  ['RedisLock', new RedisLock(single, { onError, prefix: 'exit:' })],
  ['Redlock', new Redlock(masters, { onError, prefix: 'exit:' })],
];
const waiters: Promise<void>[] = [];

// Failed acquires on an unreachable Redis (nothing listens on deadPort). Done first: ioredis itself keeps a process up
// for 2 s after disconnect() of a client that is still trying to connect (a timer that destroys the socket), which the
// parent allows for.
const dead = [0, 1, 2].map(() => new Redis({ host, port: deadPort }));
for (const d of dead) d.on('error', () => undefined);
for (const locks of [new RedisLock(dead[0]!), new Redlock(dead)]) {
  const e = await locks.acquire('x', { wait: 1_000 }).catch((error: unknown) => error);
  if (!(e instanceof LockUnavailableError)) throw new Error(`expected LockUnavailableError, got ${String(e)}`);
}
for (const d of dead) d.disconnect();
report('unreachable', 'LockUnavailableError');
report('dead disconnected', Date.now());

for (const [name, locks] of lockers) {
  const plain = await locks.acquire('plain', { ttl: 5_000 });
  await plain.release();

  // Auto-extension runs (ttl 200 ms, fn 300 ms).
  await locks.using('using', () => sleep(300), { ttl: 200 });

  // A waiting acquire, woken by the release.
  const holder = await locks.acquire('wait', { ttl: 5_000 });
  const waiting = locks.acquire('wait', { wait: 5_000 });
  await sleep(30);
  await holder.release();
  await (await waiting).release();

  // A failed acquire: busy after a short wait (it subscribed, then gave up).
  const kept = await locks.acquire('held', { ttl: 60_000 }); // never released: its timers must not hold the process
  const busy = await locks.acquire('held', { wait: 100 }).catch((e: unknown) => e);
  if (!(busy instanceof LockBusyError)) throw new Error(`${name}: expected LockBusyError, got ${String(busy)}`);
  void kept;

  // A waiter still waiting when the clients are quit: it must fail, not hang.
  waiters.push(
    locks.acquire('held', { wait: 60_000 }).then(
      () => report(`${name} waiter`, 'acquired?!'),
      (e: unknown) => report(`${name} waiter`, (e as Error).name),
    ),
  );
  report(name, 'ok');
}

await Promise.all([single, ...masters].map((c) => c.quit()));
report('quit', Date.now());
// Not awaited on purpose: whatever hasp left behind must not keep the process up. They settle before it exits.
void Promise.all(waiters).then(() => report('events', events.map((e) => e.operation)));
process.on('exit', () => {
  // What was still alive at the very end, for the parent's failure message.
  report('exit', { at: Date.now(), unhandled: unhandled.length });
});
