// A replica that missed its master's last writes and is then promoted, as asynchronous replication allows in any
// failover: the fences it hands out must still be above every fence the master handed out. Real replication, made
// deterministic by detaching the replica (REPLICAOF NO ONE) before the writes it is to miss.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisLock } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { uniquePrefix, until } from './helpers.js';

let master: RedisNode;
let replica: RedisNode;

beforeAll(async () => {
  // No 5 s wait for more replicas before the first sync.
  master = await startRedis({ args: ['--repl-diskless-sync-delay', '0'] });
  replica = await startRedis({ args: ['--replicaof', master.host, String(master.port)] });
  const probe = replica.client();
  await until(async () => (await probe.info('replication')).includes('master_link_status:up'), 10_000, 'the replica link');
});

afterAll(async () => {
  await stopAll();
});

describe('RedisLock on a promoted replica that missed the last writes', () => {
  it('hands out fences above every fence of the old master', async () => {
    const prefix = uniquePrefix('promoted');
    const onMaster = master.client();
    const before = new RedisLock(onMaster, { prefix });
    for (let i = 0; i < 3; i++) await (await before.acquire('k')).release();
    // The replica has everything so far, the fence key included.
    expect(await onMaster.wait(1, 5_000)).toBe(1);
    const onReplica = replica.client();
    const fenceKey = lockNames(prefix, 'k').fence;
    const replicated = await onReplica.get(fenceKey);
    expect(replicated).not.toBeNull();

    // Detached, it keeps what it has; the master goes on handing out fences that it will never see.
    await onReplica.replicaof('NO', 'ONE');
    let last = 0;
    for (let i = 0; i < 20; i++) {
      const lease = await before.acquire('k');
      last = lease.fence;
      await lease.release();
    }
    expect(await onReplica.get(fenceKey)).toBe(replicated);
    expect(Number(replicated)).toBeLessThan(last);

    // Promoted: clients move to it, as after a failover.
    const after = new RedisLock(onReplica, { prefix });
    const fences: number[] = [];
    for (let i = 0; i < 3; i++) {
      const lease = await after.acquire('k');
      fences.push(lease.fence);
      await lease.release();
    }
    expect(fences[0]).toBeGreaterThan(last);
    expect(fences).toEqual([...fences].sort((a, b) => a - b));
    expect(new Set(fences).size).toBe(3);
    before.close();
    after.close();
  });
});
