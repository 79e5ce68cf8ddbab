import { expect } from 'vitest';
import { createEnginePool, type EnginePoolOptions, type WorkerPool } from '../../src/engine/pool.js';
import { WORKER_SCRIPT } from './cli.js';
import { DEMO_MODEL_DIR } from './demo-model.js';

/**
 * A worker pool in this process of one one-thread worker (the built worker module) with the demo model
 * loaded, for `use`; closed after. `options` go over those (metrics, a worker module of the test's own).
 */
export async function withDemoPool(use: (pool: WorkerPool) => Promise<void>, options: Partial<EnginePoolOptions> = {}): Promise<void> {
  const pool = createEnginePool({ workers: 1, queueMax: 4, executionProvider: 'cpu', threadsPerWorker: 1, preload: [{ dir: DEMO_MODEL_DIR }], workerScript: WORKER_SCRIPT, ...options });
  try {
    await expect.poll(() => pool.readiness().ready, { timeout: 60_000, interval: 20 }).toBe(true);
    await use(pool);
  } finally {
    await pool.close();
  }
}
