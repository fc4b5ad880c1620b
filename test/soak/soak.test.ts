// Runs the soak (test/soak/soak.ts) for 30 seconds as part of the suite, so CI's `pnpm test` covers it: mixed lock and
// rate-limit traffic under injected faults must end with zero violations and a process that exits by itself.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect, it, onTestFinished } from 'vitest';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const SECONDS = Number(process.env.SOAK_SECONDS ?? 30);

it(`soaks ${SECONDS} s of lock and limit traffic with faults: no violations, and the process exits by itself`, async () => {
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/soak/soak.ts', '--seconds', String(SECONDS)], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  // On a timeout, end the soak with SIGTERM: its harness then kills the redis-server processes it started. (If this
  // worker dies instead, the soak's harness watcher sees it orphaned and ends it and its servers.)
  onTestFinished(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
  });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
  // The counts are the point of a soak: show them in the test log whatever the outcome.
  console.log(output);
  expect(code, output).toBe(0);
  expect(output).toMatch(/OK: no violations/);
}, (SECONDS + 90) * 1_000);
