// Child process of the exit test: uses hasp on a Redis Cluster, quits the client (unless told to keep it), prints
// "done", and must then exit on its own. Usage: exit-child.ts <port,port,...> <bucket|lock> <quit|keep>
import { Cluster } from 'ioredis';
import { RedisLock, TokenBucket } from '../../packages/core/src/index.js';

const [portList = '', what = 'bucket', end = 'quit'] = process.argv.slice(2);
const client = new Cluster(portList.split(',').map((port) => ({ host: '127.0.0.1', port: Number(port) })));
const prefix = `exit:${process.pid}:`;

if (what === 'bucket') {
  const bucket = new TokenBucket({ capacity: 2, rate: 1, redis: client, prefix });
  // Keys on every master, so every node connection is in use.
  for (let i = 0; i < 12; i++) {
    await bucket.take(`k${i}`, 2);
    if ((await bucket.take(`k${i}`)).allowed) throw new Error('an empty bucket admitted');
    await bucket.peek(`k${i}`);
    await bucket.reset(`k${i}`);
  }
} else {
  // A waiter opens hasp's own subscriber connection (a duplicate of the Cluster client).
  const locks = new RedisLock(client, { prefix });
  const holder = await locks.acquire('k');
  const waiting = locks.acquire('k', { wait: 5_000 });
  setTimeout(() => void holder.release(), 50);
  await (await waiting).release();
}

if (end === 'quit') await client.quit();
process.stdout.write('done\n');
