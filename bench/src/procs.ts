// Process bookkeeping for the benchmark: forked Node children that speak a small IPC protocol, spawned tools
// (redis-benchmark), and a cleanup that kills exactly the PIDs this run started (also on error and SIGINT).
import { type ChildProcess, fork, type Serializable, spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as delay } from 'node:timers/promises';

const HERE = path.dirname(fileURLToPath(import.meta.url));
/** The child entry point every forked benchmark process runs. */
const CHILD = path.join(HERE, 'child.ts');

const live = new Map<number, { child: ChildProcess; what: string }>();
let hooked = false;

/** Kills every process this run started, by PID, synchronously (safe inside 'exit'). */
export function killAll(): void {
  for (const [pid, { child }] of live) {
    try {
      if (child.exitCode === null && child.signalCode === null) process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  live.clear();
}

function installHooks(): void {
  if (hooked) return;
  hooked = true;
  process.on('exit', killAll);
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.once(signal, () => {
      process.stderr.write(`\n[bench] ${signal}: stopping ${live.size} child process(es)\n`);
      killAll();
      process.exit(130);
    });
  }
}

function track(child: ChildProcess, what: string): void {
  installHooks();
  if (child.pid === undefined) throw new Error(`could not start ${what}`);
  const pid = child.pid;
  live.set(pid, { child, what });
  child.once('exit', () => live.delete(pid));
}

/** A message a child sends back. */
export type ChildMessage = { type: 'result'; data: unknown } | { type: 'error'; message: string } | { type: 'ready'; data: unknown };

/** A forked benchmark child (runs src/child.ts under tsx). */
export interface Child {
  readonly pid: number;
  /** Resolves with the next message of `type`, rejects when the child errs, exits first, or `timeoutMs` passes. */
  next(type: 'result' | 'ready', timeoutMs: number): Promise<unknown>;
  send(message: unknown): void;
  /** Ends the child (SIGTERM, then SIGKILL) and waits for it. */
  stop(): Promise<void>;
}

/** Forks src/child.ts with `job`. `nodeArgs` are extra Node flags (e.g. --expose-gc, --cpu-prof). */
export function forkChild(job: unknown, options: { nodeArgs?: string[]; env?: Record<string, string> } = {}): Child {
  const child = fork(CHILD, [], {
    execArgv: ['--import', 'tsx', ...(options.nodeArgs ?? [])],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    env: { ...process.env, ...options.env },
  });
  const what = `child ${(job as { kind?: string }).kind ?? ''}`;
  track(child, what);
  const inbox: ChildMessage[] = [];
  const waiters = new Set<() => void>();
  let exited = false;
  child.on('message', (m: ChildMessage) => {
    inbox.push(m);
    for (const w of [...waiters]) w();
  });
  child.once('exit', (code, signal) => {
    exited = true;
    inbox.push({ type: 'error', message: `${what} exited (code ${code}, signal ${signal}) before answering` });
    for (const w of [...waiters]) w();
  });
  child.send(job as Serializable);
  return {
    pid: child.pid!,
    next(type, timeoutMs) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`${what} did not answer within ${Math.round(timeoutMs / 1000)} s`));
        }, timeoutMs);
        const check = () => {
          const i = inbox.findIndex((m) => m.type === type || m.type === 'error');
          if (i < 0) return;
          const m = inbox.splice(i, 1)[0]!;
          waiters.delete(check);
          clearTimeout(timer);
          if (m.type === 'error') reject(new Error(m.message));
          else resolve(m.data);
        };
        waiters.add(check);
        check();
      });
    },
    send(message) {
      if (!exited && child.connected) child.send(message as Serializable);
    },
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const done = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await Promise.race([done, delay(3_000)]);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await Promise.race([done, delay(1_000)]);
    },
  };
}

/** Forks a child for one job and returns its single result; the child exits by itself after answering. */
export async function runChild<T>(job: unknown, timeoutMs: number, options?: Parameters<typeof forkChild>[1]): Promise<T> {
  const child = forkChild(job, options);
  try {
    return (await child.next('result', timeoutMs)) as T;
  } finally {
    await child.stop();
  }
}

/** Spawns a command (tracked, killed on exit) and returns its stdout. */
export function runCommand(cmd: string, args: string[], timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    track(child, cmd);
    let out = '';
    let err = '';
    child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve(out);
      else reject(new Error(`${cmd} failed (code ${code}, signal ${signal}): ${err.trim().slice(-500)}`));
    });
    child.once('error', reject);
  });
}
