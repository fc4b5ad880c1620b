// Vitest global setup: fail the whole run early, with install instructions, when redis-server is missing or too old.
import { requireRedisVersion } from './redis.js';

/**
 * Checks that redis-server is on PATH and is 6.2 or later. Each test file starts and stops its own servers (stopAll in
 * afterAll), so there is no teardown; a worker that cannot (killed, or orphaned by vitest's main process) is covered by
 * the harness's watcher.
 */
export default function setup(): void {
  requireRedisVersion();
}
