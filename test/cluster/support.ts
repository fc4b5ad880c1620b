// Shared pieces of the Redis Cluster tests and the soak run (no vitest here): slot ownership, keys placed on chosen
// masters, subscriber counts over all nodes, and manual slot migration.
import { Redis, type Cluster } from 'ioredis';

/** One master of a cluster as CLUSTER NODES describes it. */
export interface MasterInfo {
  id: string;
  port: number;
  /** Inclusive slot ranges. */
  ranges: [number, number][];
}

/** The masters that own slots, from CLUSTER NODES on any node (the view of the node `client` picks). */
export async function masters(client: Cluster | Redis): Promise<MasterInfo[]> {
  const text = (await client.cluster('NODES')) as string;
  return text
    .trim()
    .split('\n')
    .map((line) => line.split(' '))
    .filter((f) => f[2]!.includes('master'))
    .map((f) => ({
      id: f[0]!,
      port: portOf(f[1]!),
      // Slot fields look like "0-5460" or "42"; importing/migrating markers ("[42->-id]") are not ownership.
      ranges: f
        .slice(8)
        .filter((r) => !r.startsWith('['))
        .map((r) => {
          const [a, b] = r.split('-').map(Number);
          return [a!, b ?? a!] as [number, number];
        }),
    }));
}

/** The hash slot Redis computes for `name` (CLUSTER KEYSLOT, so the server's own rules decide). */
export async function slotOf(client: Cluster | Redis, name: string): Promise<number> {
  return Number(await client.cluster('KEYSLOT', name));
}

/** The port of the master that owns `slot` in `view`. */
export function ownerOf(view: readonly MasterInfo[], slot: number): number {
  const owner = view.find((m) => m.ranges.some(([a, b]) => slot >= a && slot <= b));
  if (!owner) throw new Error(`no master owns slot ${slot}`);
  return owner.port;
}

/**
 * `perMaster` keys for every master, found by trying `label:0`, `label:1`, ... : the key's slot is that of the Redis
 * name `name(key)` (e.g. its lock stem). Returns the keys grouped by master port.
 */
export async function keysPerMaster(
  client: Cluster,
  label: string,
  name: (key: string) => string,
  perMaster = 1,
): Promise<Map<number, string[]>> {
  const view = await masters(client);
  const byPort = new Map<number, string[]>(view.map((m) => [m.port, []]));
  for (let i = 0; i < 1_000; i++) {
    const key = `${label}:${i}`;
    const list = byPort.get(ownerOf(view, await slotOf(client, name(key))))!;
    if (list.length < perMaster) list.push(key);
    if ([...byPort.values()].every((l) => l.length >= perMaster)) return byPort;
  }
  throw new Error(`could not place ${perMaster} keys on each of ${view.length} masters`);
}

/** Subscribers of `channel` summed over every master (PUBSUB NUMSUB counts only the node it is sent to). */
export async function subscribers(client: Cluster, channel: string): Promise<number> {
  const counts = await Promise.all(
    client.nodes('master').map(async (node) => {
      const [, n] = (await node.pubsub('NUMSUB', channel)) as [string, number];
      return Number(n);
    }),
  );
  return counts.reduce((a, b) => a + b, 0);
}

/** The port of a CLUSTER NODES address field ("127.0.0.1:7000@17000"). */
function portOf(address: string): number {
  return Number(address.split('@')[0]!.split(':').pop());
}

/** Runs `fn` on a short-lived connection to one node (no retries, no offline queue); rejects with its error. */
export async function withNode<T>(port: number, fn: (node: Redis) => Promise<T>): Promise<T> {
  const node = new Redis({
    host: '127.0.0.1',
    port,
    lazyConnect: true,
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
  });
  node.on('error', () => undefined);
  try {
    await node.connect();
    return await fn(node);
  } finally {
    node.disconnect();
  }
}

/**
 * {@link withNode}, resolving `fallback` when the node does not answer, so a dead node reads as "nothing there".
 */
export function onNode<T>(port: number, fallback: T, fn: (node: Redis) => Promise<T>): Promise<T> {
  return withNode(port, fn).catch(() => fallback);
}

/** Whether the node on `observer` sees `slot` owned by a master other than the one on `from` (a takeover). */
export async function tookOver(observer: number, slot: number, from: number): Promise<boolean> {
  const view = await onNode(observer, undefined, (node) => masters(node));
  return view !== undefined && ownerOf(view, slot) !== from;
}

/** The ports among `ports` whose node has a subscriber on `channel`. */
export async function subscriberPorts(ports: readonly number[], channel: string): Promise<number[]> {
  const counts = await Promise.all(
    ports.map((port) => onNode(port, 0, async (node) => Number(((await node.pubsub('NUMSUB', channel)) as [string, number])[1]))),
  );
  return ports.filter((_, i) => counts[i]! > 0);
}

/** cluster_state (ok, fail) as the node on `port` sees it, or 'down' when it does not answer. */
export function clusterState(port: number): Promise<string> {
  return onNode(port, 'down', async (node) => /cluster_state:(\w+)/.exec((await node.cluster('INFO')) as string)?.[1] ?? '?');
}

/** True when the node on `observer` has flagged the node on `port` as failed (FAIL, not just PFAIL). */
export function flaggedFailed(observer: number, port: number): Promise<boolean> {
  return onNode(observer, false, async (node) => {
    const lines = ((await node.cluster('NODES')) as string).trim().split('\n');
    const line = lines.find((l) => l.split(' ')[1]?.startsWith(`127.0.0.1:${port}@`));
    return line !== undefined && line.split(' ')[2]!.split(',').includes('fail');
  });
}

/** A slot migration in progress, driven by hand as `redis-cli --cluster reshard` does it. */
export interface Migration {
  /** MIGRATEs every key of the slot to the destination and assigns the slot to it on every master. */
  finish(): Promise<void>;
}

/**
 * Starts moving `slot` from its owner to `to` (CLUSTER SETSLOT IMPORTING / MIGRATING). Until `finish()`, commands on
 * the slot meet ASK redirections and, for multi-key scripts whose keys are split between the nodes or partly
 * missing, TRYAGAIN.
 */
export async function startMigration(view: readonly MasterInfo[], slot: number, to: MasterInfo): Promise<Migration> {
  const fromPort = ownerOf(view, slot);
  const from = view.find((m) => m.port === fromPort)!;
  if (from.id === to.id) throw new Error(`slot ${slot} already lives on ${to.port}`);
  const admins = new Map(view.map((m) => [m.port, new Redis({ host: '127.0.0.1', port: m.port, lazyConnect: true })]));
  const src = admins.get(from.port)!;
  const dst = admins.get(to.port)!;
  const close = (): void => {
    for (const a of admins.values()) a.disconnect();
  };
  try {
    await dst.cluster('SETSLOT', slot, 'IMPORTING', from.id);
    await src.cluster('SETSLOT', slot, 'MIGRATING', to.id);
  } catch (error) {
    close();
    throw error;
  }
  return {
    async finish() {
      try {
        for (let round = 0; round < 100; round++) {
          const keys = (await src.cluster('GETKEYSINSLOT', slot, 100)) as string[];
          if (keys.length === 0) break;
          await src.call('MIGRATE', '127.0.0.1', to.port, '', 0, 5_000, 'KEYS', ...keys);
        }
        // The destination first, as redis-cli does, so it never answers MOVED back to the source.
        await dst.cluster('SETSLOT', slot, 'NODE', to.id);
        await src.cluster('SETSLOT', slot, 'NODE', to.id);
        for (const [port, admin] of admins) {
          if (port !== from.port && port !== to.port) await admin.cluster('SETSLOT', slot, 'NODE', to.id);
        }
      } finally {
        close();
      }
    },
  };
}

/** What {@link cutReplicaLink} did, to undo once the replica has taken over. */
export interface CutLink {
  /** The port of the replica whose link was cut. */
  replicaPort: number;
  /** Lets the replica authenticate to a master without a password again. */
  restore(): Promise<void>;
}

/**
 * Cuts the replication link of the master on `masterPort` (which must have one replica) so that it stays down: the
 * replica is given a password the master does not have, then the master drops it. What the master answers from then
 * on never reaches the replica, as in a partition followed by a crash: killing the master now loses those writes for
 * sure, where a plain SIGKILL loses them only if it lands between a reply and its replication.
 */
export async function cutReplicaLink(masterPort: number): Promise<CutLink> {
  const lines = (await withNode(masterPort, async (node) => String(await node.cluster('NODES')))).trim().split('\n');
  const id = lines.find((l) => l.split(' ')[2]!.includes('myself'))!.split(' ')[0];
  const replica = lines.find((l) => l.split(' ')[3] === id);
  if (replica === undefined) throw new Error(`the master on :${masterPort} has no replica`);
  const replicaPort = portOf(replica.split(' ')[1]!);
  await withNode(replicaPort, (node) => node.config('SET', 'masterauth', 'hasp-test-cut'));
  await withNode(masterPort, (node) => node.client('KILL', 'TYPE', 'replica'));
  return {
    replicaPort,
    restore: () => withNode(replicaPort, (node) => node.config('SET', 'masterauth', '')).then(() => undefined),
  };
}
