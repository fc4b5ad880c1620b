// Test harness: private redis-server processes (single nodes and clusters) on free loopback ports.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';

const HOST = '127.0.0.1';
/** How long a server (or a cluster) may take to answer before start-up fails. */
const READY_TIMEOUT_MS = 10_000;
/** Interval between readiness probes. */
const POLL_MS = 25;
/** How much of a server's stdout/stderr is kept for error messages. */
const OUTPUT_LIMIT = 16 * 1024;
/** Bus ports are the data port + 10_000 (Redis 6.2 has no `cluster-port`). */
const CLUSTER_BUS_OFFSET = 10_000;

/** Options for {@link startRedis}. */
export interface StartOptions {
  /** Extra `redis-server` arguments, appended after the harness's own. */
  args?: string[];
}

/** One private redis-server process. */
export interface RedisNode {
  readonly host: '127.0.0.1';
  readonly port: number;
  /** `redis://127.0.0.1:<port>` */
  readonly url: string;
  /** The pid of the current process; changes on {@link RedisNode.restart}. */
  readonly pid: number;
  /** The server's private working directory, removed by {@link RedisNode.stop}. */
  readonly dir: string;
  /** A new ioredis client for this node; disconnected by `stop()` / `stopAll()`. */
  client(options?: RedisOptions): Redis;
  /** Sends `signal` (default SIGKILL) and resolves once the process has exited. */
  kill(signal?: NodeJS.Signals): Promise<void>;
  /** SIGSTOP: the server keeps its connections but answers nothing. */
  pause(): void;
  /** SIGCONT after {@link RedisNode.pause}. */
  resume(): void;
  /** Starts the server again on the same port and directory (killing it first if it runs). */
  restart(): Promise<void>;
  /** Kills the server, disconnects its tracked clients and removes its directory. Idempotent. */
  stop(): Promise<void>;
  /** FLUSHALL. */
  flush(): Promise<void>;
}

/** A Redis Cluster of private masters, built with `redis-cli --cluster create`. */
export interface RedisCluster {
  readonly nodes: RedisNode[];
  /** A new ioredis `Cluster` client seeded with every node; disconnected by `stop()` / `stopAll()`. */
  client(options?: ClusterOptions): Cluster;
  /** Stops every node and disconnects the tracked clients. Idempotent. */
  stop(): Promise<void>;
}

/** Options for {@link startCluster}. */
export interface ClusterStartOptions {
  /** Number of masters; `redis-cli --cluster create` needs at least 3. */
  masters?: number;
  /** Replicas per master (default 0); `nodes` then holds masters × (1 + replicas) nodes, roles as redis-cli assigns them. */
  replicas?: number;
  /** Extra `redis-server` arguments for every node. */
  args?: string[];
}

/** The message thrown when a Redis binary is not on PATH. */
export function missingBinaryMessage(name: 'redis-server' | 'redis-cli'): string {
  return (
    `${name} not found. Install it: Debian/Ubuntu: \`sudo apt-get install -y redis-server\`; ` +
    `macOS: \`brew install redis\`; or put a Redis 6.2+ ${name} binary on PATH.`
  );
}

/** The absolute path of `name` on PATH; throws {@link missingBinaryMessage} when it is absent. */
export function requireBinary(name: 'redis-server' | 'redis-cli'): string {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (!dir) continue;
    const file = path.join(dir, name);
    try {
      fs.accessSync(file, fs.constants.X_OK);
      if (fs.statSync(file).isFile()) return file;
    } catch {
      // not in this PATH entry
    }
  }
  throw new Error(missingBinaryMessage(name));
}

/**
 * Why a redis-server whose `--version` printed `output` cannot run hasp, or undefined when it can: hasp's lock
 * scripts use `SET ... GET` (6.2), so an older server would fail every lock test with a syntax error. Output without a
 * version (a fork that says nothing) passes.
 */
export function redisVersionProblem(output: string): string | undefined {
  const m = / v=(\d+)\.(\d+)/.exec(output);
  if (m === null) return undefined;
  const major = Number(m[1]);
  const minor = Number(m[2]);
  if (major > 6 || (major === 6 && minor >= 2)) return undefined;
  return (
    `redis-server is Redis ${major}.${minor}; hasp needs 6.2 or later. Put a newer redis-server and redis-cli first on ` +
    'PATH (Debian/Ubuntu: Redis\'s APT repository, https://github.com/redis/redis-debian; macOS: `brew install redis`); ' +
    '`bash scripts/ensure-redis.sh` prints the commands.'
  );
}

/** Throws {@link redisVersionProblem} for the redis-server on PATH (and {@link missingBinaryMessage} when there is none). */
export function requireRedisVersion(): void {
  const output = execFileSync(requireBinary('redis-server'), ['--version'], { encoding: 'utf8' });
  const problem = redisVersionProblem(output);
  if (problem !== undefined) throw new Error(problem);
}

// ---------------------------------------------------------------------------
// Process bookkeeping: every child this module spawned and that has not exited,
// every node and cluster not yet stopped.

const liveChildren = new Set<ChildProcess>();
const liveNodes = new Set<ServerNode>();
const liveClusters = new Set<ClusterHandle>();
let exitHooksInstalled = false;

function killLiveChildrenSync(): void {
  for (const child of liveChildren) {
    try {
      if (child.pid !== undefined) process.kill(child.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  liveChildren.clear();
  recordLiveChildren();
  for (const node of liveNodes) fs.rmSync(node.dir, { recursive: true, force: true, maxRetries: 2 });
}

// The hooks below run only if this process gets to run them. When it cannot (SIGKILL; a vitest worker whose main
// process ended, which vitest leaves spinning on its closed channel instead of exiting), a watcher outside it does the
// same: a shell started once per process, detached, that reads our children's PIDs from a file when this process is
// gone or orphaned (its parent changed), kills those still running redis-server or redis-cli, and ends an orphaned
// process too. The file lists live children only (rewritten on every start and exit), so a PID reused since is never in
// it for long.
const PID_FILE = path.join(os.tmpdir(), `hasp-harness-${process.pid}.pids`);

function recordLiveChildren(): void {
  try {
    const pids = [...liveChildren].map((c) => c.pid).filter((pid) => pid !== undefined);
    if (pids.length) fs.writeFileSync(PID_FILE, `${pids.join('\n')}\n`);
    else fs.rmSync(PID_FILE, { force: true });
  } catch {
    // tmpdir not writable: the in-process hooks still run
  }
}

/** The watcher's script: `sh -c WATCHER hasp-harness-watch <pid> <parent pid> <pid file>`. */
const WATCHER = String.raw`
w=$1; p=$2; f=$3
parent() { if [ -r /proc/$1/stat ]; then sed 's/^.*) [A-Za-z] \([0-9]*\).*$/\1/' /proc/$1/stat; else ps -o ppid= -p "$1" | tr -d ' '; fi; }
cmdline() { if [ -r /proc/$1/cmdline ]; then tr '\000' ' ' < /proc/$1/cmdline; else ps -o command= -p "$1"; fi; }
while kill -0 "$w" 2>/dev/null; do
  q=$(parent "$w" 2>/dev/null)
  # Orphaned: ended first, so that it starts no server after the file is read (fault tests restart theirs).
  if [ -n "$q" ] && [ "$q" != "$p" ]; then kill -9 "$w" 2>/dev/null; sleep 1; break; fi
  sleep 1
done
if [ -f "$f" ]; then
  while read -r c; do
    case "$(cmdline "$c" 2>/dev/null)" in *redis-server*|*redis-cli*) kill -9 "$c" 2>/dev/null ;; esac
  done < "$f"
  rm -f "$f"
fi
`;

function startWatcher(): void {
  try {
    const watcher = spawn('sh', ['-c', WATCHER, 'hasp-harness-watch', String(process.pid), String(process.ppid), PID_FILE], {
      detached: true,
      stdio: 'ignore',
    });
    watcher.on('error', () => undefined);
    watcher.unref();
  } catch {
    // no sh: the in-process hooks still run
  }
}

/**
 * Makes sure our servers die with this process. 'exit' covers normal ends and
 * crashes; the signal handlers cover vitest, which ends fork workers with
 * SIGTERM (no 'exit' event then). A handler re-raises its signal when it is
 * the only listener, so the default action (termination) is kept. The watcher
 * covers the rest (see startWatcher).
 */
/**
 * Starts this process's watcher now (see startWatcher), whether or not it starts servers itself: for a vitest worker,
 * whose test may start them in a child process (the soak), and which must not outlive vitest's main process.
 */
export function watchThisProcess(): void {
  installExitHooks();
}

function installExitHooks(): void {
  if (exitHooksInstalled) return;
  exitHooksInstalled = true;
  startWatcher();
  process.on('exit', killLiveChildrenSync);
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    const onSignal = (): void => {
      killLiveChildrenSync();
      process.off(signal, onSignal);
      if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
    };
    process.on(signal, onSignal);
  }
}

/** A spawned child, tracked until it exits, with the tail of its output. */
interface Proc {
  readonly child: ChildProcess;
  /** Resolves on the child's 'exit' event. */
  readonly exited: Promise<void>;
  /** Resolves on 'close': exited and stdio drained, so `output()` is complete. */
  readonly closed: Promise<void>;
  output(): string;
}

function spawnTracked(file: string, args: string[]): Proc {
  installExitHooks();
  const child = spawn(file, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, REDISCLI_CLUSTER_YES: '1' },
  });
  let output = '';
  const collect = (chunk: Buffer): void => {
    output = (output + chunk.toString('utf8')).slice(-OUTPUT_LIMIT);
  };
  child.stdout?.on('data', collect);
  child.stderr?.on('data', collect);
  // A spawn failure (ENOENT, EACCES) or an undeliverable signal; the former also ends in 'close'.
  child.on('error', (err) => collect(Buffer.from(`\n[harness] ${err.message}\n`)));
  if (child.pid !== undefined) {
    liveChildren.add(child);
    recordLiveChildren();
  }
  const exited = new Promise<void>((resolve) => {
    child.once('exit', () => {
      liveChildren.delete(child);
      recordLiveChildren();
      resolve();
    });
    // spawn errors emit 'close' but never 'exit'
    child.once('close', () => resolve());
  });
  const closed = new Promise<void>((resolve) => child.once('close', () => resolve()));
  return { child, exited, closed, output: () => output };
}

function isRunning(child: ChildProcess): boolean {
  return child.pid !== undefined && child.exitCode === null && child.signalCode === null;
}

// ---------------------------------------------------------------------------
// A minimal RESP client for probes, so readiness checks need no reconnect logic.

function encodeCommand(args: string[]): string {
  return `*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`;
}

/** Parses one simple/error/integer/bulk reply; undefined while incomplete. */
function parseReply(buf: Buffer): { value: string } | { error: Error } | undefined {
  const eol = buf.indexOf('\r\n');
  if (eol < 0) return undefined;
  const line = buf.toString('utf8', 1, eol);
  switch (String.fromCharCode(buf[0] ?? 0)) {
    case '+':
    case ':':
      return { value: line };
    case '-':
      return { error: new Error(line) };
    case '$': {
      const len = Number(line);
      if (len < 0) return { value: '' };
      if (buf.length < eol + 2 + len + 2) return undefined;
      return { value: buf.toString('utf8', eol + 2, eol + 2 + len) };
    }
    default:
      return { error: new Error(`unsupported reply: ${line}`) };
  }
}

/** Runs one command on a fresh connection; rejects on an error reply, a refused/closed connection or a timeout. */
function probe(port: number, args: string[], timeoutMs = 1_000): Promise<string> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const socket = net.connect({ host: HOST, port });
    const finish = (result: { value: string } | { error: Error }): void => {
      clearTimeout(timer);
      socket.destroy();
      if ('error' in result) reject(result.error);
      else resolve(result.value);
    };
    const timer = setTimeout(
      () => finish({ error: new Error(`${HOST}:${port} did not answer ${args[0]} within ${timeoutMs} ms`) }),
      timeoutMs,
    );
    socket.on('connect', () => socket.write(encodeCommand(args)));
    socket.on('data', (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      const reply = parseReply(buf);
      if (reply) finish(reply);
    });
    socket.on('error', (error) => finish({ error }));
    socket.on('close', () => finish({ error: new Error(`${HOST}:${port} closed the connection`) }));
  });
}

// ---------------------------------------------------------------------------
// Ports and server start-up.

/** Binds `port` (0: any) on the loopback; the bound port, or undefined when it is taken. */
function tryBind(port: number): Promise<number | undefined> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EADDRINUSE' || err.code === 'EACCES') resolve(undefined);
      else reject(err);
    });
    server.listen({ host: HOST, port, exclusive: true }, () => {
      const bound = (server.address() as net.AddressInfo).port;
      server.close(() => resolve(bound));
    });
  });
}

/**
 * A port that was free a moment ago. Cluster nodes also need port + 10_000 for
 * the bus, so they draw from 20000-29999, below Linux's ephemeral range.
 */
async function freePort(clusterBus: boolean): Promise<number> {
  if (!clusterBus) {
    const port = await tryBind(0);
    if (port !== undefined) return port;
  }
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = 20_000 + Math.floor(Math.random() * 10_000);
    if ((await tryBind(port)) !== undefined && (await tryBind(port + CLUSTER_BUS_OFFSET)) !== undefined) return port;
  }
  throw new Error('no free loopback port (pair) found');
}

/** The server lost the race for its port (or bus port) to another process. */
class PortBusyError extends Error {}

/** Spawns redis-server on `port` and resolves once this very process answers PING. */
async function launch(port: number, dir: string, args: string[]): Promise<Proc> {
  const proc = spawnTracked(requireBinary('redis-server'), [
    '--port', String(port),
    '--bind', HOST,
    '--save', '',
    '--appendonly', 'no',
    '--dir', dir,
    '--daemonize', 'no',
    ...args,
  ]);
  const { child } = proc;
  const deadline = Date.now() + READY_TIMEOUT_MS;
  for (;;) {
    if (!isRunning(child)) {
      await proc.closed;
      const how = child.signalCode ?? `code ${child.exitCode}`;
      const message = `redis-server on port ${port} exited (${how}) before it was ready:\n${proc.output()}`;
      throw /Address already in use/i.test(proc.output()) ? new PortBusyError(message) : new Error(message);
    }
    try {
      // INFO's process_id tells our server apart from another one that won the port.
      if ((await probe(port, ['PING'], 500)) === 'PONG') {
        const info = await probe(port, ['INFO', 'server'], 500);
        if (info.includes(`process_id:${child.pid}\r\n`)) return proc;
      }
    } catch {
      // not up yet (refused, LOADING, slow): keep polling until the deadline
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      await proc.closed;
      throw new Error(
        `redis-server on port ${port} did not answer PING within ${READY_TIMEOUT_MS} ms:\n${proc.output()}`,
      );
    }
    await Promise.race([delay(POLL_MS), proc.exited]);
  }
}

const ignoreError = (): void => {};

class ServerNode implements RedisNode {
  readonly host = HOST;
  readonly url: string;
  #proc: Proc;
  #paused = false;
  #stopped = false;
  readonly #clients = new Set<Redis>();

  constructor(
    readonly port: number,
    readonly dir: string,
    private readonly args: string[],
    proc: Proc,
  ) {
    this.url = `redis://${HOST}:${port}`;
    this.#proc = proc;
  }

  get pid(): number {
    return this.#proc.child.pid as number;
  }

  client(options: RedisOptions = {}): Redis {
    const client = new Redis({ host: HOST, port: this.port, ...options });
    // Killed and paused nodes are the point of this harness: keep ioredis's
    // "Unhandled error event" noise out of the test output.
    client.on('error', ignoreError);
    this.#clients.add(client);
    return client;
  }

  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const { child, exited } = this.#proc;
    if (isRunning(child)) {
      child.kill(signal);
      // SIGKILL reaches a stopped process; any other signal waits for SIGCONT.
      if (this.#paused && signal !== 'SIGKILL') child.kill('SIGCONT');
    }
    this.#paused = false;
    await exited;
  }

  pause(): void {
    this.#signal('SIGSTOP');
    this.#paused = true;
  }

  resume(): void {
    this.#signal('SIGCONT');
    this.#paused = false;
  }

  async restart(): Promise<void> {
    if (this.#stopped) throw new Error(`redis node ${this.url} was stopped; start a new one`);
    await this.kill();
    // The old socket is gone with the process, but a client's TIME_WAIT or
    // another process can hold the port for a moment.
    const deadline = Date.now() + READY_TIMEOUT_MS;
    for (;;) {
      try {
        this.#proc = await launch(this.port, this.dir, this.args);
        return;
      } catch (err) {
        if (!(err instanceof PortBusyError) || Date.now() > deadline) throw err;
        await delay(100);
      }
    }
  }

  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    for (const client of this.#clients) client.disconnect();
    this.#clients.clear();
    await this.kill('SIGKILL');
    liveNodes.delete(this);
    await rm(this.dir, { recursive: true, force: true, maxRetries: 3 });
  }

  async flush(): Promise<void> {
    await probe(this.port, ['FLUSHALL'], 5_000);
  }

  #signal(signal: NodeJS.Signals): void {
    if (!isRunning(this.#proc.child)) throw new Error(`redis node ${this.url} is not running`);
    this.#proc.child.kill(signal);
  }
}

/** Starts one node; `extraArgs` gets the node's directory (for files that must live there). */
async function startNode(extraArgs: (dir: string) => string[], clusterBus: boolean): Promise<ServerNode> {
  requireBinary('redis-server');
  const dir = await mkdtemp(path.join(os.tmpdir(), 'hasp-redis-'));
  const args = extraArgs(dir);
  try {
    for (let attempt = 1; ; attempt++) {
      const port = await freePort(clusterBus);
      try {
        const node = new ServerNode(port, dir, args, await launch(port, dir, args));
        liveNodes.add(node);
        return node;
      } catch (err) {
        if (!(err instanceof PortBusyError) || attempt >= 10) throw err;
      }
    }
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
}

/** Starts `n` nodes in parallel; if any fails, the others are stopped and the first error is thrown. */
async function startNodes(n: number, extraArgs: (dir: string) => string[], clusterBus: boolean): Promise<ServerNode[]> {
  const results = await Promise.allSettled(Array.from({ length: n }, () => startNode(extraArgs, clusterBus)));
  const nodes = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const failure = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failure) {
    await Promise.all(nodes.map((node) => node.stop()));
    throw failure.reason;
  }
  return nodes;
}

/** Starts a private redis-server on a free loopback port and resolves once it answers PING. */
export async function startRedis(options: StartOptions = {}): Promise<RedisNode> {
  const args = [...(options.args ?? [])];
  return startNode(() => args, false);
}

/** Starts `n` independent nodes in parallel (e.g. Redlock's masters). */
export async function startRedisNodes(n: number, options: StartOptions = {}): Promise<RedisNode[]> {
  const args = [...(options.args ?? [])];
  return startNodes(n, () => args, false);
}

// ---------------------------------------------------------------------------
// Clusters.

class ClusterHandle implements RedisCluster {
  #stopped = false;
  readonly #clients = new Set<Cluster>();

  constructor(readonly nodes: RedisNode[]) {}

  client(options: ClusterOptions = {}): Cluster {
    const client = new Cluster(
      this.nodes.map((node) => ({ host: HOST, port: node.port })),
      options,
    );
    client.on('error', ignoreError);
    this.#clients.add(client);
    return client;
  }

  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    for (const client of this.#clients) client.disconnect();
    this.#clients.clear();
    await Promise.all(this.nodes.map((node) => node.stop()));
    liveClusters.delete(this);
  }
}

/** Runs a tracked child to completion; rejects with its output on a non-zero exit. */
async function run(file: string, args: string[]): Promise<string> {
  const proc = spawnTracked(file, args);
  await proc.closed;
  if (proc.child.exitCode !== 0) {
    const how = proc.child.signalCode ?? `code ${proc.child.exitCode}`;
    throw new Error(`${path.basename(file)} ${args.join(' ')} failed (${how}):\n${proc.output()}`);
  }
  return proc.output();
}

/**
 * Resolves once every node reports `cluster_state:ok`, knows all the others, and (with replicas) sees `masters`
 * masters and every replica's link to its master is up. `cluster_state:ok` comes before the replicas are set up, and a
 * failover test that kills a master then would find no replica to take over.
 */
async function waitForClusterOk(nodes: RedisNode[], masters: number): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  const replicated = nodes.length > masters;
  let last: string[] = [];
  for (;;) {
    last = await Promise.all(
      nodes.map(async (node) => {
        const info = await probe(node.port, ['CLUSTER', 'INFO'], 1_000);
        if (!replicated) return info;
        const view = await probe(node.port, ['CLUSTER', 'NODES'], 1_000);
        const replication = await probe(node.port, ['INFO', 'replication'], 1_000);
        return `${info}\n${view}\n${replication}`;
      }).map((p) => p.catch((err: Error) => err.message)),
    );
    const ok = last.every((out) => {
      if (!out.includes('cluster_state:ok') || !out.includes(`cluster_known_nodes:${nodes.length}\r\n`)) return false;
      if (!replicated) return true;
      const flags = out.split('\n').filter((l) => /^[0-9a-f]{40} /.test(l)).map((l) => l.split(' ')[2] ?? '');
      const masterCount = flags.filter((f) => f.split(',').includes('master')).length;
      if (masterCount !== masters) return false;
      return !out.includes('role:slave') || out.includes('master_link_status:up');
    });
    if (ok) return;
    if (Date.now() > deadline) {
      throw new Error(
        `cluster not ok within ${READY_TIMEOUT_MS} ms:\n` +
          nodes.map((node, i) => `--- ${node.url}\n${last[i]}`).join('\n'),
      );
    }
    await delay(POLL_MS * 4);
  }
}

/**
 * Starts masters × (1 + replicas) cluster-enabled nodes, joins them with `redis-cli --cluster create` and waits for
 * `cluster_state:ok`.
 */
export async function startCluster(options: ClusterStartOptions = {}): Promise<RedisCluster> {
  const { masters = 3, replicas = 0 } = options;
  if (!Number.isInteger(masters) || masters < 3) {
    throw new RangeError(`masters must be an integer >= 3 (redis-cli --cluster create needs 3), got ${masters}`);
  }
  if (!Number.isInteger(replicas) || replicas < 0) {
    throw new RangeError(`replicas must be an integer >= 0, got ${replicas}`);
  }
  const cli = requireBinary('redis-cli');
  const extra = options.args ?? [];
  const nodes = await startNodes(
    masters * (1 + replicas),
    (dir) => [
      '--cluster-enabled', 'yes',
      '--cluster-config-file', path.join(dir, 'nodes.conf'),
      '--cluster-node-timeout', '2000',
      // A master's first sync to its replica waits 5 s by default for more replicas to share it.
      '--repl-diskless-sync-delay', '0',
      ...extra,
    ],
    true,
  );
  try {
    await run(cli, [
      '--cluster', 'create',
      ...nodes.map((node) => `${HOST}:${node.port}`),
      '--cluster-replicas', String(replicas),
      '--cluster-yes',
    ]);
    await waitForClusterOk(nodes, masters);
  } catch (err) {
    await Promise.all(nodes.map((node) => node.stop()));
    throw err;
  }
  const cluster = new ClusterHandle(nodes);
  liveClusters.add(cluster);
  return cluster;
}

/** Stops every cluster and node this process started, and reaps any other child still running. */
export async function stopAll(): Promise<void> {
  await Promise.all([...liveClusters].map((cluster) => cluster.stop()));
  await Promise.all([...liveNodes].map((node) => node.stop()));
  await Promise.all(
    [...liveChildren].map(async (child) => {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      if (isRunning(child)) child.kill('SIGKILL');
      await exited;
    }),
  );
}
