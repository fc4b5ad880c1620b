// For redis.test.ts: a process that starts a private redis-server through the harness, prints
// `{"pid": ..., "server": ...}` and then waits to be killed. With `--spawn`, it is instead the parent of such a
// process, relays its line, and waits: killing it leaves the child orphaned.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startRedis } from './redis.js';

if (process.argv.includes('--spawn')) {
  const child = spawn(process.execPath, ['--import', 'tsx', fileURLToPath(import.meta.url)], { stdio: ['ignore', 'pipe', 'inherit'] });
  child.stdout.on('data', (chunk: Buffer) => process.stdout.write(chunk));
} else {
  const node = await startRedis();
  process.stdout.write(`${JSON.stringify({ pid: process.pid, server: node.pid })}\n`);
}
// Kept alive until killed.
setInterval(() => undefined, 60_000);
