// The HTTP regimes' limits, apart from the apps so that the report (in the parent process) reads them without loading
// Express, Koa and the peer libraries.
export type Regime = 'allowed' | 'flooded';

/** Per-key limits: `allowed` never limits anyone; `flooded` lets 100 requests a minute through for the one key. */
export const LIMITS: Record<Regime, { capacity: number; perMinute: number }> = {
  allowed: { capacity: 1_000_000, perMinute: 1_000_000 },
  flooded: { capacity: 100, perMinute: 100 },
};
