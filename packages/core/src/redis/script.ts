// Runs Lua scripts: EVAL the first time on a connection, EVALSHA after that (falling back to EVAL on NOSCRIPT); never
// touches the user's client (no defineCommand, no option changes).
//
// The calls made on one standalone connection are merged into a single call of a bundle script, which runs each of them
// in order and answers with an array of their replies: those of one callback (an I/O callback and the promise reactions
// it sets off) and, for calls every caller awaits (acquires, takes), those of one turn of the event loop. A command
// costs the client (ioredis builds, queues and parses each one) and the server (parse, dispatch, script set-up) far
// more than a script body does, and under load many calls meet: one socket read brings the replies of 50 lock workers,
// each of which goes on to its next call, and an HTTP server reads many requests in one turn. A script may also have a
// batch form of its own for merged calls of that script alone (the token bucket's take: an HTTP server's requests).
import { createHash } from 'node:crypto';
import type { RedisClient } from '../types.js';
import { realNextTick, realSetImmediate } from '../util/real-timers.js';
import { batchWrites, sendIfFull, writeNow } from './auto-pipeline.js';
import { unavailable } from './call.js';
import { hashSlot } from './keys.js';

// The scripts each connection has been sent with EVAL. Keyed by the client's socket, so after a reconnect (perhaps to a
// restarted or failed-over server that lost its scripts) the first call sends EVAL again instead of paying a NOSCRIPT
// round trip. Cluster clients have no single socket: keyed by the client and the master its slot map names for the
// call's keys (a stale map costs a NOSCRIPT round trip). Keyed by the client alone, a script first run on one master
// went to the others as EVALSHA, met NOSCRIPT, and came back as EVAL after the calls made meanwhile: a waiter's attempt
// could land after its own LEAVE and put it back in the line.
const known = new WeakMap<object, Set<string>>();
/** Clients whose server refused EVALSHA itself (renamed away, or an ACL user without it): every call goes as EVAL. */
const evalOnly = new WeakSet<object>();
const knownOnNodes = new WeakMap<object, Map<string, Set<string>>>();

/** The one connection a call on `keys` goes to, as far as script loading goes; undefined for a Cluster's keyed calls. */
function connectionOf(client: RedisClient, keys: readonly string[]): object | undefined {
  const stream = (client as { stream?: object }).stream;
  return stream !== undefined || keys.length === 0 ? (stream ?? client) : undefined;
}

/** The set of scripts `client` has sent with EVAL where a call on `keys` goes. */
function knownFor(client: RedisClient, keys: readonly string[]): Set<string> {
  const connection = connectionOf(client, keys);
  let scripts: Set<string> | undefined;
  if (connection !== undefined) {
    scripts = known.get(connection);
    if (scripts === undefined) {
      scripts = new Set();
      known.set(connection, scripts);
    }
    return scripts;
  }
  const c = client as { slots?: (string[] | undefined)[]; options?: { keyPrefix?: unknown } };
  const keyPrefix = typeof c.options?.keyPrefix === 'string' ? c.options.keyPrefix : '';
  const node = c.slots?.[hashSlot(keyPrefix + keys[0]!)]?.[0] ?? '';
  let nodes = knownOnNodes.get(client);
  if (nodes === undefined) {
    nodes = new Map();
    knownOnNodes.set(client, nodes);
  }
  scripts = nodes.get(node);
  if (scripts === undefined) {
    scripts = new Set();
    nodes.set(node, scripts);
  }
  return scripts;
}

// Every script in creation order: the bundle runs those that existed when it was built, by index.
const registry: Script[] = [];

/** A Lua script with its SHA1 computed once. */
export class Script {
  readonly sha: string;
  /** Position in the bundle (1-based, as Lua counts). */
  readonly index: number;

  /** See the constructor's `options.patient`. */
  readonly patient: boolean;
  /** See the constructor's `options.sharedClock`. */
  readonly sharedClock: boolean;
  /** See the constructor's `options.batch`. */
  readonly batch: BatchForm | undefined;

  /**
   * @param source the Lua source
   * @param options.patient true when every caller awaits the reply before anything else happens (an acquire, a take):
   * such a call may wait until the end of this turn of the event loop, to share a command with the calls of the other
   * callbacks of the turn (an HTTP server reads many requests in one turn, each in its own callback). Nothing can
   * observe its effect before its reply, so a command sent meanwhile running first is just one more concurrent order.
   * Other calls (a release, often not awaited) go out at the end of their own callback, so that a command the app
   * sends after them from a later callback never runs first.
   * @param options.sharedClock true when the script may see, for `redis.call('TIME')`, the time the merged command it
   * runs in first read (its calls run as one script, at one instant as far as keys' expiry goes): TIME costs the
   * server about as much as a token bucket's GET or a lock's SET. For a script whose calls on one key must see a
   * clock that moves (none here: a lock's fence is one above the last one when the clock has not moved past it, and
   * waiters that arrive in one command are as concurrent as their calls were), leave it off.
   * @param options.batch a script that runs many calls of this one in one command, used instead of the bundle when
   * every call of a merged command is of this script with the same leading arguments (see {@link BatchFormOptions}).
   */
  constructor(
    readonly source: string,
    options: { patient?: boolean; sharedClock?: boolean; batch?: BatchFormOptions } = {},
  ) {
    this.patient = options.patient ?? false;
    this.sharedClock = options.sharedClock ?? false;
    this.batch = options.batch === undefined ? undefined : { ...options.batch, script: new Script(options.batch.source) };
    this.sha = createHash('sha1').update(source).digest('hex');
    this.index = registry.push(this);
  }

  /**
   * Runs the script. On a standalone connection the call waits for the end of the current callback (or, if `patient`,
   * of this turn of the event loop) and goes out merged with the other calls made meanwhile on that connection, in the
   * order they were made; otherwise it goes out now. Either way a script reply that is an error rejects this call only.
   */
  run(client: RedisClient, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    const stream = (client as { stream?: object }).stream;
    if (
      stream !== undefined &&
      (client as { status?: string }).status === 'ready' &&
      keys.length < FIELD &&
      args.length < FIELD &&
      bundleOf(this) !== undefined
    ) {
      return enqueue(client, stream, this, keys, args);
    }
    // Calls made after a merged batch started on this connection must not overtake it.
    sendPending(client);
    batchWrites(client);
    return this.send(client, keys, args);
  }

  /**
   * Sends the script as its own command. On a connection that has not run it yet this sends EVAL, which loads and runs
   * it in one round trip (EVALSHA first would take two, letting a later command of ours overtake it); later calls send
   * EVALSHA and fall back to EVAL once if the server lost the script (SCRIPT FLUSH, failover).
   */
  send(client: RedisClient, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    if (evalOnly.has(client)) return this.eval(client, keys, args);
    const scripts = knownFor(client, keys);
    if (!scripts.has(this.sha)) {
      // Marked at once: our later calls go out after this one on the same connection, so the server knows it by then.
      // On a Cluster only once it ran, on the master the slot map names by then: a stale map sent it elsewhere (MOVED).
      if (connectionOf(client, keys) !== undefined) {
        scripts.add(this.sha);
        return this.eval(client, keys, args);
      }
      return this.eval(client, keys, args).then((reply) => {
        knownFor(client, keys).add(this.sha);
        return reply;
      });
    }
    // Spread, not passed as arrays: ioredis flattens every command's arguments, and flattening nested arrays made its
    // Command constructor about 30% slower (1.3 against 1.0 µs here), more than the spread costs.
    return client.evalsha(this.sha, keys.length, ...keys, ...args).catch((error: unknown) => {
      if (isEvalshaRefused(error)) {
        // Refused before anything ran, so EVAL does it now; and every later call too, instead of working on a
        // connection's first call of a script only (an acquire that went out as EVAL, and its release refused).
        evalOnly.add(client);
        return this.eval(client, keys, args);
      }
      if (!isNoScript(error)) throw error;
      // The server lost its scripts (SCRIPT FLUSH): not this one only. The next call of each other script goes as EVAL
      // too, instead of meeting NOSCRIPT and coming back for a second trip that a command sent meanwhile overtakes.
      scripts.clear();
      scripts.add(this.sha);
      return this.eval(client, keys, args);
    });
  }

  /**
   * EVAL, whose failure names the script by its SHA instead of carrying its text: ioredis puts the command's arguments
   * on a reply error (`command.args`), which ends up as the `cause` of hasp's error, and loggers that print causes deeply
   * would print the whole script (up to 11 KB) with the first failure on each connection.
   */
  private eval(client: RedisClient, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    return client.eval(this.source, keys.length, ...keys, ...args).catch((error: unknown) => {
      const command = (error as { command?: { args?: unknown } } | null)?.command;
      if (Array.isArray(command?.args) && command.args[0] === this.source) command.args[0] = `<hasp script ${this.sha}>`;
      throw error;
    });
  }
}

function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith('NOSCRIPT');
}

/** `ERR unknown command 'evalsha'…` (rename-command) or `NOPERM … 'evalsha' command…` (ACL). */
function isEvalshaRefused(error: unknown): boolean {
  return error instanceof Error && /^(ERR unknown command|NOPERM)\b[^\n]*\bevalsha\b/i.test(error.message);
}

// ---------------------------------------------------------------------------------------------------------------------
// The bundle: every script known when it is first needed, each wrapped as a function of where its keys and arguments
// start in the bundle's KEYS and ARGV and how many there are, and a loop that runs the calls of a batch. ARGV is
// [n, one header per call (op + 64 × #keys + 4096 × #args), then every call's args]; KEYS is every call's keys in order.
// A script reads `KEYS[i]` and `ARGV[i]` only as plain reads (wrapped() checks), so those become reads at the call's
// offset, nil past its own count, as in a command of its own; no table per call. Each call runs under pcall, so
// an error fails that call alone (as it would have as its own command; like a script, it keeps the writes it made
// before failing).

/** Keys, arguments and scripts per call fit the header's fields. */
const FIELD = 64;

let bundle: { script: Script; members: ReadonlySet<Script> } | undefined;

/** The script as a bundle function, or undefined if it reads KEYS or ARGV other than as `KEYS[i]`/`ARGV[i]`. */
function wrapped(s: Script): string | undefined {
  const body = s.source
    .replace(/\bKEYS\[(\d+)\]/g, (_, i: string) => `(${i} <= nk_ and KEYS[k_ + ${i}] or nil)`)
    .replace(/\bARGV\[(\d+)\]/g, (_, i: string) => `(${i} <= na_ and ARGV[a_ + ${i}] or nil)`)
    .replace(/redis\.call\('TIME'\)/g, (call) => (s.sharedClock ? 'time_()' : call));
  if (/\b(KEYS|ARGV)\b/.test(body.replace(/\b(KEYS\[k_|ARGV\[a_) \+ /g, ''))) return undefined;
  return `ops[${s.index}] = function(k_, nk_, a_, na_)\n${body}\nend\n`;
}

function bundleOf(script: Script): Script | undefined {
  if (bundle === undefined) {
    const members = new Set<Script>();
    let ops = '';
    for (const s of registry) {
      const fn = s.index < FIELD ? wrapped(s) : undefined;
      if (fn === undefined) continue;
      members.add(s);
      ops += fn;
    }
    const source = `local ops = {}
local tm_ = nil
local function time_()
  if tm_ == nil then tm_ = redis.call('TIME') end
  return tm_
end
${ops}
local n = tonumber(ARGV[1])
local out = {}
local k, a = 0, 1 + n
for i = 1, n do
  local h = tonumber(ARGV[i + 1])
  local nk = math.floor(h / ${FIELD}) % ${FIELD}
  local na = math.floor(h / ${FIELD * FIELD})
  local ok, r = pcall(ops[h % ${FIELD}], k, nk, a, na)
  if not ok then
    if type(r) ~= 'table' or not r.err then r = {err = tostring(r)} end
  elseif r == nil then
    r = false
  end
  out[i] = r
  k = k + nk
  a = a + na
end
return out
`;
    // Built once: a script made later (none are, outside tests) is sent on its own.
    bundle = { script: new Script(source), members };
  }
  return bundle.members.has(script) ? bundle.script : undefined;
}

/**
 * Whether calls of `script` can share a command with other calls (a script that reads KEYS or ARGV as a whole, or whose
 * source merely names them outside an index, cannot). For tests: every script of hasp's own hot paths must.
 */
export function isBundled(script: Script): boolean {
  return bundleOf(script) !== undefined;
}

/**
 * How a script runs many of its calls in one command, cheaper than the bundle, which pays per call for its generality
 * (a header to decode, a pcall, a reply table; a token bucket take spends a third of its time in Redis on them). Such a
 * command's KEYS are every call's keys in order; its ARGV is the leading arguments the calls share, then each call's
 * other arguments in order. Its reply is flat: `width` values per call, in order; a call fails alone when one of its
 * values is an error.
 */
export interface BatchFormOptions {
  /** The batch script's Lua source. */
  readonly source: string;
  /** Keys per call. */
  readonly keys: number;
  /** Arguments per call. */
  readonly args: number;
  /** How many leading arguments the calls of one command must share (sent once). */
  readonly shared: number;
  /** Reply values per call. */
  readonly width: number;
}

interface BatchForm extends BatchFormOptions {
  readonly script: Script;
}

interface Call {
  readonly script: Script;
  readonly keys: readonly string[];
  readonly args: readonly (string | number)[];
  readonly resolve: (reply: unknown) => void;
  readonly reject: (error: unknown) => void;
}

interface Batch {
  readonly client: RedisClient;
  readonly stream: object;
  readonly calls: Call[];
  /** The tick its last call was made in, and how many of its calls that tick made. */
  tick: number;
  inTick: number;
  /** Whether a call in it must leave at the end of its callback (a flush is queued for then). */
  eager: boolean;
}

// The open batch of each connection, sent at the end of the current callback, or of the turn when all its calls are
// patient, or once full (BATCH_PER_TICK, BATCH_PER_TURN).
const open = new Map<object, Batch>();

/**
 * Calls per merged command made in one tick (one callback and the promise reactions it set off), per connection with a
 * batch open: few enough that the server starts on a batch while the client still prepares the next. One socket read
 * brings the replies of 50 lock workers, each making its next call in that tick; on one server, batches of up to 8 gave
 * 6% more lock cycles/s than up to 32, and 1.5× as many as up to 64.
 */
const BATCH_PER_TICK = 8;

/**
 * Calls per merged command at most, per connection with a batch open, when they come from many callbacks of one turn
 * (an HTTP server reads each request in a callback of its own, and makes one take in it). Such a batch grows while the
 * client reads more requests anyway, so the server gains little from starting early, and each command costs both
 * sides far more than a call in it: on Koa with 64 connections, merging up to 64 takes rather than 8 (about 25 per
 * command rather than 7) cost 1.5 µs less client CPU and 1 µs less Redis CPU per request.
 */
const BATCH_PER_TURN = 64;

// Ticks counted while calls are being made: a batch counts its calls per tick (BATCH_PER_TICK).
let tick = 0;
let counting = false;
function nextTick(): void {
  tick++;
  counting = false;
}

function enqueue(client: RedisClient, stream: object, script: Script, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
  return new Promise((resolve, reject) => {
    let batch = open.get(stream);
    if (batch === undefined) {
      batch = { client, stream, calls: [], eager: false, tick, inTick: 0 };
      open.set(stream, batch);
      // The end of the turn: whatever is still open then goes out at once (no turn is left to share a write with).
      if (script.patient) realSetImmediate(flushBatch, batch, true);
    }
    if (!script.patient && !batch.eager) {
      batch.eager = true;
      // Once this callback and every promise reaction it set off have run (a tick queued from a reaction runs after
      // the whole microtask queue), so all the replies of one socket read and what their callers do next share it.
      realNextTick(flushBatch, batch);
    }
    batch.calls.push({ script, keys, args, resolve, reject });
    if (!counting) {
      counting = true;
      // Queued from a promise reaction, this runs once the whole microtask queue has: the tick ends there.
      realNextTick(nextTick);
    }
    if (batch.tick !== tick) {
      batch.tick = tick;
      batch.inTick = 0;
    }
    batch.inTick++;
    if (batch.inTick >= BATCH_PER_TICK * open.size || batch.calls.length >= BATCH_PER_TURN * open.size) flushBatch(batch);
  });
}

/**
 * Sends the calls waiting on `client`'s connection now. For a command hasp sends on its own (a script that is not
 * bundled, a bucket reset's DEL): it must not overtake calls made before it.
 */
export function sendPending(client: RedisClient): void {
  const stream = (client as { stream?: object }).stream;
  const batch = stream === undefined ? undefined : open.get(stream);
  if (batch !== undefined) flushBatch(batch);
}

/**
 * Sends the calls made so far on `client` and writes its socket out now, not merged with later calls at the end of the
 * callback or turn: for a release that must reach Redis before what the process writes next elsewhere.
 */
export function sendNow(client: RedisClient): void {
  sendPending(client);
  writeNow(client);
}

/**
 * The one command that runs `calls` (two or more, of bundled scripts): the batch form of their script when they all
 * share one, else the bundle. Exported for the benchmark, which measures the server on what hasp really sends.
 */
export function mergedCommand(calls: readonly Pick<Call, 'script' | 'keys' | 'args'>[]): {
  form: BatchForm | undefined;
  script: Script;
  keys: string[];
  args: (string | number)[];
} {
  const form = batchFormOf(calls);
  // Both forms take every call's keys in order; they differ in how they lay out the arguments.
  const keys: string[] = [];
  for (const c of calls) for (const k of c.keys) keys.push(k);
  let args: (string | number)[];
  if (form !== undefined) {
    args = calls[0]!.args.slice(0, form.shared);
    for (const c of calls) for (let j = form.shared; j < form.args; j++) args.push(c.args[j]!);
  } else {
    args = [calls.length];
    for (const c of calls) args.push(c.script.index + FIELD * c.keys.length + FIELD * FIELD * c.args.length);
    for (const c of calls) for (const a of c.args) args.push(a);
  }
  const script = form?.script ?? bundleOf(calls[0]!.script);
  if (script === undefined) throw new Error('mergedCommand: a script that is not bundled');
  return { form, script, keys, args };
}

function flushBatch(batch: Batch, late = false): void {
  // Already sent (it filled up, or a call that cannot join it flushed it): the timer has nothing left to do.
  if (open.get(batch.stream) !== batch) return;
  open.delete(batch.stream);
  const { client, calls } = batch;
  // The connection may have dropped since the calls were made: fail them now rather than leave them in ioredis's
  // offline queue, to run whenever Redis is back (bounded() checked the connection only when each call was made).
  const down = unavailable(client);
  if (down !== undefined) {
    for (const c of calls) c.reject(down);
    return;
  }
  if (calls.length === 1) {
    // Alone in its callback (a release, say): still written together with the other callbacks' commands of this turn.
    // A merged command goes out at once instead, so the server starts on it while we prepare the next.
    const c = calls[0]!;
    if (!late) batchWrites(client);
    forward(c, () => c.script.send(client, c.keys, c.args));
    return;
  }
  const n = calls.length;
  const { form, script, keys, args } = mergedCommand(calls);
  let pending: Promise<unknown>;
  if (!late) batchWrites(client, n);
  try {
    pending = script.send(client, keys, args);
  } catch (error) {
    for (const c of calls) c.reject(error);
    return;
  } finally {
    sendIfFull(client);
  }
  pending.then(
    (reply) => {
      if (!Array.isArray(reply)) {
        const error = unexpectedReply(reply);
        for (const c of calls) c.reject(error);
        return;
      }
      const replies = reply as unknown[];
      if (form !== undefined) {
        settleWidth(calls, replies, form.width);
        return;
      }
      for (let i = 0; i < n; i++) {
        const r = replies[i];
        if (r instanceof Error) calls[i]!.reject(r);
        else calls[i]!.resolve(r === undefined ? null : r);
      }
    },
    (error: unknown) => {
      for (const c of calls) c.reject(error);
    },
  );
}

/** The batch form all of `calls` can share, if any: one script, the same shape, the same leading arguments. */
function batchFormOf(calls: readonly Pick<Call, 'script' | 'keys' | 'args'>[]): BatchForm | undefined {
  const script = calls[0]!.script;
  const form = script.batch;
  if (form === undefined) return undefined;
  const lead = calls[0]!.args;
  for (const c of calls) {
    if (c.script !== script || c.keys.length !== form.keys || c.args.length !== form.args) return undefined;
    for (let j = 0; j < form.shared; j++) if (c.args[j] !== lead[j]) return undefined;
  }
  return form;
}

/** Answers each call with its `width` values of a batch form's flat reply, or with the error among them. */
function settleWidth(calls: readonly Call[], replies: readonly unknown[], width: number): void {
  for (let i = 0; i < calls.length; i++) {
    const values = replies.slice(i * width, i * width + width);
    const error = values.find((v) => v instanceof Error);
    if (error !== undefined) calls[i]!.reject(error);
    else calls[i]!.resolve(values);
  }
}

/**
 * The error for a reply no script of hasp's gives, such as the `QUEUED` of a connection inside the user's `MULTI`
 * (`multi({ pipeline: false })`), where every command is queued until EXEC, and ours would run then, unanswered.
 */
export function unexpectedReply(reply: unknown): Error {
  const shown = typeof reply === 'string' ? JSON.stringify(reply.slice(0, 40)) : typeof reply;
  return new Error(`Redis answered ${shown} where a script's reply was due (is the client inside a MULTI of yours?)`);
}

function forward(c: Call, send: () => Promise<unknown>): void {
  try {
    send().then(c.resolve, c.reject);
  } catch (error) {
    c.reject(error);
  }
}
