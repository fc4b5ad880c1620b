// Tests of the redis-server harness itself: start, pause/resume, kill/restart, cluster, cleanup.
import fs from 'node:fs';
import net from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import {
  missingBinaryMessage,
  startCluster,
  startRedis,
  stopAll,
  type RedisNode,
} from './redis.js';

/** Every pid the tests saw, checked dead after stopAll. */
const seenPids = new Set<number>();
const seenDirs = new Set<string>();

function track(node: RedisNode): RedisNode {
  seenPids.add(node.pid);
  seenDirs.add(node.dir);
  return node;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    expect((err as NodeJS.ErrnoException).code).toBe('ESRCH');
    return false;
  }
}

/** Resolves with the connection error code, or 'connected'. */
function connectOutcome(port: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    socket.once('connect', () => {
      socket.destroy();
      resolve('connected');
    });
    socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}

afterAll(async () => {
  await stopAll();
});

describe('startRedis', () => {
  it('throws an install hint when redis-server is not on PATH', async () => {
    const path = process.env.PATH;
    process.env.PATH = '/nonexistent-hasp-test';
    try {
      await expect(startRedis()).rejects.toThrow(missingBinaryMessage('redis-server'));
    } finally {
      process.env.PATH = path;
    }
    expect(missingBinaryMessage('redis-server')).toBe(
      'redis-server not found. Install it: Debian/Ubuntu: `sudo apt-get install -y redis-server`; ' +
        'macOS: `brew install redis`; or put a Redis 6.2+ redis-server binary on PATH.',
    );
  });

  it('serves, pauses, resumes, dies, restarts on the same port and flushes', async () => {
    const node = track(await startRedis());
    expect(node.host).toBe('127.0.0.1');
    expect(node.url).toBe(`redis://127.0.0.1:${node.port}`);
    expect(isAlive(node.pid)).toBe(true);

    const redis = node.client({ commandTimeout: 300 });
    await redis.set('greeting', 'hello');
    expect(await redis.get('greeting')).toBe('hello');

    node.pause();
    await expect(redis.ping()).rejects.toThrow(/timed out/i);
    node.resume();
    expect(await redis.ping()).toBe('PONG');

    const firstPid = node.pid;
    await node.kill();
    expect(isAlive(firstPid)).toBe(false);
    expect(await connectOutcome(node.port)).toBe('ECONNREFUSED');

    await node.restart();
    track(node);
    expect(node.pid).not.toBe(firstPid);
    expect(isAlive(node.pid)).toBe(true);
    expect(await connectOutcome(node.port)).toBe('connected');
    // Nothing persists across a restart (--save '' --appendonly no).
    const fresh = node.client();
    expect(await fresh.get('greeting')).toBeNull();
    // The first client reconnects on its own.
    await expect.poll(() => redis.ping().catch(() => 'down'), { timeout: 10_000 }).toBe('PONG');

    await fresh.set('a', '1');
    await node.flush();
    expect(await fresh.dbsize()).toBe(0);
  });

  it('takes extra server arguments', async () => {
    const node = track(await startRedis({ args: ['--maxmemory', '7mb'] }));
    const [, value] = (await node.client().config('GET', 'maxmemory')) as [string, string];
    expect(value).toBe(String(7 * 1024 * 1024));
  });

  it('stops a paused node', async () => {
    const node = track(await startRedis());
    const pid = node.pid;
    node.pause();
    await node.stop();
    expect(isAlive(pid)).toBe(false);
    expect(fs.existsSync(node.dir)).toBe(false);
    await node.stop(); // idempotent
  });
});

describe('startCluster', () => {
  it('creates a 3-master cluster that serves keys across slots', async () => {
    const cluster = await startCluster({ masters: 3 });
    expect(cluster.nodes).toHaveLength(3);
    cluster.nodes.forEach(track);

    const client = cluster.client();
    const keys = Array.from({ length: 100 }, (_, i) => `key:${i}`);
    await Promise.all(keys.map((key, i) => client.set(key, String(i))));
    expect(await Promise.all(keys.map((key) => client.get(key)))).toEqual(keys.map((_, i) => String(i)));

    // Each master owns a third of the slots, so each holds some of the keys.
    const sizes = await Promise.all(cluster.nodes.map((node) => node.client().dbsize()));
    expect(sizes.reduce((a, b) => a + b, 0)).toBe(100);
    for (const size of sizes) expect(size).toBeGreaterThan(0);
  });

  it('rejects fewer than 3 masters', async () => {
    await expect(startCluster({ masters: 2 })).rejects.toThrow(RangeError);
  });
});

describe('stopAll', () => {
  it('leaves no server alive and no directory behind', async () => {
    track(await startRedis());
    await stopAll();
    expect(seenPids.size).toBeGreaterThanOrEqual(7);
    for (const pid of seenPids) expect(isAlive(pid), `pid ${pid}`).toBe(false);
    for (const dir of seenDirs) expect(fs.existsSync(dir), dir).toBe(false);
  });
});
