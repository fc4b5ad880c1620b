// Nothing hasp starts keeps a process alive: a child process that used RedisLock and Redlock (waiting, failing,
// auto-extending, a lease left held) exits on its own soon after quitting its ioredis clients.
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startRedisNodes, stopAll, type RedisNode } from '../harness/redis.js';
import { within } from './helpers.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
/** Slack for the child to wind down after quit() (waiters fail at once; hasp's own timers are unref'd). */
const EXIT_WITHIN_MS = 1_000;
/** ioredis destroys the socket of a client disconnected while connecting after this long (AbstractConnector). */
const IOREDIS_DISCONNECT_GRACE_MS = 2_000;

let nodes: RedisNode[];

beforeAll(async () => {
  nodes = await startRedisNodes(5);
});

afterAll(async () => {
  await stopAll();
});

/** A loopback port nothing listens on (bound, then released). */
function closedPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

it('exits by itself after quitting its clients, with no unhandled rejection', async () => {
  const child = spawn(process.execPath, ['--import', 'tsx', path.join(here, 'lock-exit-child.ts')], {
    cwd: root,
    env: { ...process.env, PORTS: nodes.map((n) => n.port).join(','), DEAD_PORT: String(await closedPort()) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<{ code: number | null; at: number }>((resolve) =>
    child.once('exit', (code) => resolve({ code, at: Date.now() })),
  );
  let result: { code: number | null; at: number };
  try {
    result = await within(exited, 30_000, 'the child process to exit');
  } catch (error) {
    child.kill('SIGKILL');
    throw new Error(`${(error as Error).message}\nstdout:\n${stdout}\nstderr:\n${stderr}`);
  }
  const steps = new Map<string, unknown>();
  for (const line of stdout.split('\n')) {
    if (!line.startsWith('{')) continue;
    const { step, detail } = JSON.parse(line) as { step: string; detail: unknown };
    steps.set(step, detail);
  }
  const context = `stdout:\n${stdout}\nstderr:\n${stderr}`;
  expect(result.code, context).toBe(0);
  expect(steps.get('RedisLock'), context).toBe('ok');
  expect(steps.get('Redlock'), context).toBe('ok');
  expect(steps.get('unreachable'), context).toBe('LockUnavailableError');
  expect(steps.has('unhandled'), context).toBe(false);
  // The waiters still waiting at quit() failed with the typed error instead of hanging.
  expect(steps.get('RedisLock waiter'), context).toBe('LockUnavailableError');
  expect(steps.get('Redlock waiter'), context).toBe('LockUnavailableError');
  expect(steps.get('events'), context).toEqual([]);
  // Exit follows the last of: quit(), and ioredis's own 2 s grace after disconnecting the clients that never connected.
  const quitAt = steps.get('quit') as number;
  const idleFrom = Math.max(quitAt, (steps.get('dead disconnected') as number) + IOREDIS_DISCONNECT_GRACE_MS);
  console.log(`child exited ${result.at - quitAt} ms after quit(), ${result.at - idleFrom} ms after ioredis's grace`);
  expect(result.at - idleFrom, context).toBeLessThan(EXIT_WITHIN_MS);
});

it('settles a Redlock acquire on clients that have all ended before the process exits (its pause between rounds keeps it up)', async () => {
  const child = spawn(process.execPath, ['--import', 'tsx', path.join(here, 'redlock-ended-child.ts')], {
    cwd: root,
    env: { ...process.env, DEAD_PORT: String(await closedPort()) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  const code = await within(new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c))), 20_000, 'the child to exit');
  const steps = stdout.trim().split('\n').map((l) => JSON.parse(l) as { step: string; detail: unknown });
  expect(steps, stdout).toEqual([
    { step: 'ended', detail: true },
    { step: 'rejected', detail: 'LOCK_UNAVAILABLE' },
    { step: 'finally', detail: true },
  ]);
  expect(code).toBe(0);
});
