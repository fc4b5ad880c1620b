// Runs an example app (examples/<name>/src/main.ts) as a child process on a free port, and stops it by PID.
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository root. */
export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
/** How long an example may take to print its URL (tsx compiles it on the fly). */
const START_TIMEOUT_MS = 20_000;
/** How long it may take to exit after SIGTERM: it closes its server and its Redis connections, nothing keeps it alive. */
const STOP_TIMEOUT_MS = 5_000;

/** One running example. */
export interface ShopProcess {
  readonly name: string;
  /** `http://localhost:<port>` as the example printed it. */
  readonly url: string;
  readonly pid: number;
  /** Everything it printed so far (stdout and stderr). */
  output(): string;
  /** SIGTERM to its PID; resolves with the exit code once it has exited (SIGKILL and a rejection after the timeout). */
  stop(): Promise<number | null>;
}

/**
 * Starts `examples/<name>` the way `pnpm start` does after the build (node with tsx), with PORT=0 and `env` added
 * (PAYMENT_MS, REDIS_URL, REDIS_NODES), and resolves once it printed the URL it listens on.
 */
export async function startShop(name: string, env: Record<string, string> = {}): Promise<ShopProcess> {
  const cwd = path.join(ROOT, 'examples', name);
  const childEnv: NodeJS.ProcessEnv = { ...process.env, PORT: '0', ...env };
  // The test process's own settings must not leak into the example.
  for (const key of ['REDIS_URL', 'REDIS_NODES']) if (!(key in env)) delete childEnv[key];
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], { cwd, env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (s: string) => (out += s));
  child.stderr.setEncoding('utf8').on('data', (s: string) => (out += s));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));

  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => fail(`did not print its URL within ${START_TIMEOUT_MS} ms`), START_TIMEOUT_MS);
    const onData = (): void => {
      const m = /listening on (http:\/\/localhost:\d+)/.exec(out);
      if (m) {
        cleanup();
        resolve(m[1]!);
      }
    };
    const onExit = (code: number | null): void => fail(`exited (code ${code}) before listening`);
    function cleanup(): void {
      clearTimeout(timer);
      child.stdout.off('data', onData);
      child.off('exit', onExit);
    }
    function fail(why: string): void {
      cleanup();
      kill(child);
      reject(new Error(`examples/${name} ${why}:\n${out}`));
    }
    child.stdout.on('data', onData);
    child.once('exit', onExit);
  });

  return {
    name,
    url,
    pid: child.pid!,
    output: () => out,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) process.kill(child.pid!, 'SIGTERM');
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          kill(child);
          reject(new Error(`examples/${name} did not exit within ${STOP_TIMEOUT_MS} ms of SIGTERM:\n${out}`));
        }, STOP_TIMEOUT_MS);
      });
      try {
        return await Promise.race([exited, timeout]);
      } finally {
        clearTimeout(timer);
      }
    },
  };
}

function kill(child: ChildProcess): void {
  if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) process.kill(child.pid, 'SIGKILL');
}
