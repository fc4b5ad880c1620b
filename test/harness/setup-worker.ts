// Vitest setup file, run in every worker: a worker left behind by vitest's main process (killed, or signalled alone)
// spins instead of exiting; the harness's watcher ends it, and with it any test child (the soak) and their servers.
import { watchThisProcess } from './redis.js';

watchThisProcess();
