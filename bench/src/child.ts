// Entry point of every forked benchmark process: receives one job over IPC, runs it, answers, and exits.
import { type HttpServerJob, startServer } from './http/apps.js';
import { type LoadJob, runLoad } from './http/load.js';
import { type LockJob, runContended, runUncontended } from './locks/run.js';
import { runHeap, runRedisMemory } from './memory.js';

type Job =
  | ({ kind: 'uncontended' } & LockJob)
  | ({ kind: 'contended' } & LockJob)
  | ({ kind: 'http-server' } & HttpServerJob)
  | ({ kind: 'load' } & Omit<LoadJob, 'url'>)
  | { kind: 'redis-memory'; port: number }
  | ({ kind: 'heap' } & Parameters<typeof runHeap>[0]);

function send(message: object): Promise<void> {
  return new Promise((resolve) => process.send!(message, () => resolve()));
}

async function handle(job: Job): Promise<void> {
  switch (job.kind) {
    case 'uncontended':
      return answer(await runUncontended(job));
    case 'contended':
      return answer(await runContended(job));
    case 'load': {
      // Forked while the server starts, so both load their modules at once: the server's address comes next.
      const { url } = await new Promise<{ url: string }>((resolve) => process.once('message', resolve));
      return answer(
        await runLoad({ ...job, url }, async () => {
          // Tell the parent the warm-up is over and wait for its go (it snapshots CPU counters in between).
          const go = new Promise<void>((resolve) => process.once('message', () => resolve()));
          await send({ type: 'ready', data: null });
          await go;
        }),
      );
    }
    case 'redis-memory':
      return answer(await runRedisMemory(job));
    case 'heap':
      return answer(await runHeap(job));
    case 'http-server': {
      const server = await startServer(job);
      await send({ type: 'ready', data: { port: server.port } });
      // Any later message asks for the CPU this process has used so far.
      process.on('message', () => void send({ type: 'result', data: process.cpuUsage() }));
      // Stays up until the parent ends it (SIGTERM).
      process.once('SIGTERM', () => {
        void server.close().finally(() => process.exit(0));
      });
      return;
    }
  }
}

async function answer(data: unknown): Promise<void> {
  await send({ type: 'result', data });
  // Open sockets, lingering lock timers and subscriber connections are dropped with the process.
  process.exit(0);
}

process.once('message', (job: Job) => {
  handle(job).catch(async (error: unknown) => {
    await send({ type: 'error', message: error instanceof Error ? (error.stack ?? error.message) : String(error) });
    process.exit(1);
  });
});
