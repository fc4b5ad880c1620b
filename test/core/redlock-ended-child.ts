// Child process of lock-exit.test.ts: a Redlock acquire on clients that have all ended (their retryStrategy gave up)
// must still settle, rejecting LockUnavailableError, before the process exits: nothing else keeps it alive while the
// acquire pauses between its rounds. Prints one JSON line per step.
import { Redis } from 'ioredis';
import { Redlock } from '../../packages/core/src/index.js';

const report = (step: string, detail: unknown = true): void => console.log(JSON.stringify({ step, detail }));
const port = Number(process.env.DEAD_PORT);
const clients = [0, 1, 2].map(() => new Redis({ host: '127.0.0.1', port, retryStrategy: () => null }));
for (const c of clients) c.on('error', () => undefined);
// (Not events.once: it rejects on the connection errors that come first.)
await Promise.all(clients.map((c) => (c.status === 'end' ? undefined : new Promise((resolve) => c.once('end', resolve)))));
report('ended');
try {
  await new Redlock(clients).acquire('x');
  report('acquired');
} catch (error) {
  report('rejected', (error as { code?: unknown }).code);
} finally {
  report('finally');
}
