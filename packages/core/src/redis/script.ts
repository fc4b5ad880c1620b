// Runs Lua scripts by SHA, falling back to EVAL only on NOSCRIPT; never touches the user's client (no defineCommand).
import { createHash } from 'node:crypto';
import type { RedisClient } from '../types.js';

/** A Lua script with its SHA1 computed once. */
export class Script {
  readonly sha: string;

  constructor(readonly source: string) {
    this.sha = createHash('sha1').update(source).digest('hex');
  }

  /** EVALSHA, then EVAL once if the server does not know the script yet (new node, SCRIPT FLUSH, failover). */
  async run(client: RedisClient, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    try {
      return await client.evalsha(this.sha, keys.length, ...keys, ...args);
    } catch (error) {
      if (!isNoScript(error)) throw error;
      return client.eval(this.source, keys.length, ...keys, ...args);
    }
  }
}

function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith('NOSCRIPT');
}
