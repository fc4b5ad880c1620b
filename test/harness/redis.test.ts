// Tests of the redis-server harness itself: start, pause/resume, kill/restart, cluster, cleanup.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import {
  missingBinaryMessage,
  redisVersionProblem,
  startCluster,
  startRedis,
  stopAll,
  type RedisNode,
} from './redis.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));

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

  it('refuses a redis-server older than 6.2, whose lock scripts would fail, with what to install', () => {
    const old = redisVersionProblem('Redis server v=6.0.16 sha=00000000:0 malloc=jemalloc-5.2.1 bits=64 build=a3fdef44459b3ad6');
    expect(old).toMatch(/^redis-server is Redis 6\.0; hasp needs 6\.2 or later\. .*redis-debian.*brew install redis/);
    expect(redisVersionProblem('Redis server v=5.0.7 sha=00000000:0')).toMatch(/Redis 5\.0;/);
    for (const ok of ['Redis server v=6.2.0 sha=0', 'Redis server v=7.0.15 sha=0', 'Redis server v=10.1.0 sha=0', 'Valkey server v=8.0.1 sha=0', 'something else']) {
      expect(redisVersionProblem(ok)).toBeUndefined();
    }
  });

  it("scripts/ensure-redis.sh (the README's test command runs it first) refuses a redis-server older than 6.2", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hasp-fake-redis-'));
    try {
      const run = (version: string) => {
        for (const name of ['redis-server', 'redis-cli']) {
          fs.writeFileSync(path.join(dir, name), `#!/bin/sh\necho "Redis server v=${version} sha=00000000:0 bits=64"\n`, { mode: 0o755 });
        }
        return spawnSync('bash', [fileURLToPath(new URL('../../scripts/ensure-redis.sh', import.meta.url))], {
          encoding: 'utf8',
          env: { ...process.env, PATH: `${dir}${path.delimiter}${process.env.PATH ?? ''}` },
        });
      };
      const old = run('6.0.16');
      expect(old.status).toBe(1);
      expect(old.stderr).toMatch(/is Redis 6\.0; hasp needs Redis 6\.2 or later/);
      expect(old.stderr).toContain('https://packages.redis.io/deb $(lsb_release -cs) main');
      const recent = run('6.2.14');
      expect(recent.status).toBe(0);
      expect(recent.stderr).toBe('');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
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

// The in-process hooks cannot run when the process is killed outright, or when a vitest worker is left behind by its
// main process (vitest then keeps it spinning rather than exiting): a watcher outside the process ends the servers.
describe('a process that cannot clean up', () => {
  /** Dead, or a zombie waiting for its parent to collect it. */
  function gone(pid: number): boolean {
    try {
      process.kill(pid, 0);
    } catch {
      return true;
    }
    try {
      return /^\d+ \(.*\) Z/.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'));
    } catch {
      return true;
    }
  }

  async function waitGone(pids: number[], what: string): Promise<void> {
    const deadline = Date.now() + 15_000;
    while (!pids.every(gone)) {
      if (Date.now() > deadline) throw new Error(`${what} still running 15 s later: ${pids.filter((p) => !gone(p)).join(', ')}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  /** Starts watch-child.ts and resolves its first line plus the process started here. */
  async function launchChild(args: string[]): Promise<{ started: ReturnType<typeof spawn>; line: { pid: number; server: number } }> {
    const started = spawn(process.execPath, ['--import', 'tsx', path.join(HERE, 'watch-child.ts'), ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
    const line = await new Promise<{ pid: number; server: number }>((resolve, reject) => {
      let text = '';
      started.stdout!.on('data', (chunk: Buffer) => {
        text += chunk.toString('utf8');
        const nl = text.indexOf('\n');
        if (nl >= 0) resolve(JSON.parse(text.slice(0, nl)) as { pid: number; server: number });
      });
      started.once('exit', (code) => reject(new Error(`watch-child exited (${code}) before it started its server`)));
    });
    return { started, line };
  }

  /** Ends what a failed test left: only these PIDs, which this test started. */
  function cleanUp(pids: number[]): void {
    for (const pid of pids) {
      try {
        if (!gone(pid)) process.kill(pid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
    }
  }

  it('its servers die when it is killed with SIGKILL', async () => {
    const { started, line } = await launchChild([]);
    try {
      expect(gone(line.server)).toBe(false);
      started.kill('SIGKILL');
      await waitGone([line.server], 'the redis-server of a process killed with SIGKILL');
    } finally {
      cleanUp([line.pid, line.server]);
    }
  });

  it('its servers and the process itself end when its parent dies (an orphaned vitest worker)', async () => {
    const { started, line } = await launchChild(['--spawn']);
    try {
      expect(gone(line.server)).toBe(false);
      started.kill('SIGKILL');
      await waitGone([line.server, line.pid], 'the orphaned process and its redis-server');
    } finally {
      cleanUp([line.pid, line.server]);
    }
  });
});

