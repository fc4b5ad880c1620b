// A second app process for the cross-process tests: `node --import tsx app-process.ts <framework> <redis port> <policy>`
// serves /limited (rateLimit, capacity 6, 1/h, key ?k=), /buy (withLock on ?order=, answering once /release?order=
// is called) and /quick (withLock on ?order=, answering at once, then busy for ?ms=) on its own Redis connection, and
// prints `LISTENING <url>`.
import { Redis } from 'ioredis';
import { deferred, framework, type FrameworkName } from './apps.js';

const holds = new Map<string, { promise: Promise<void>; resolve: (value: void) => void }>();
const hold = (order: string) => {
  let d = holds.get(order);
  if (!d) holds.set(order, (d = deferred()));
  return d;
};

const [name, port, policy] = process.argv.slice(2) as [FrameworkName, string, string];
const redis = new Redis({ host: '127.0.0.1', port: Number(port) });
redis.on('error', () => undefined);
const fw = await framework(name);
const app = await fw.start({
  routes: {
    '/limited': { use: [fw.rateLimit({ capacity: 6, rate: '1/h', redis, policy, key: (r: { query: { k?: string } }) => r.query.k })] },
    '/buy': {
      use: [fw.withLock((r: { query: { order?: string } }) => r.query.order, { redis })],
      handle: async (c) => {
        await hold(c.query.order!).promise;
        return undefined;
      },
    },
    // Answers at once, then keeps the process busy for ?ms= before anything else runs (as a handler's synchronous work
    // after answering, or a busy event loop, would): the lock's release must already be on its way to Redis by then.
    '/quick': {
      use: [fw.withLock((r: { query: { order?: string } }) => r.query.order, { redis })],
      handle: (c) => {
        const ms = Number(c.query.ms ?? 0);
        process.nextTick(() => {
          const end = performance.now() + ms;
          while (performance.now() < end);
        });
        return undefined;
      },
    },
    '/release': {
      handle: (c) => {
        hold(c.query.order!).resolve();
        return undefined;
      },
    },
  },
});
process.stdout.write(`LISTENING ${app.url}\n`);

const stop = (): void => {
  void app.close().finally(() => {
    redis.disconnect();
    process.exit(0);
  });
};
process.on('SIGTERM', stop);
// The test process holds our stdin: when it dies, so do we.
process.stdin.on('end', stop);
process.stdin.resume();
