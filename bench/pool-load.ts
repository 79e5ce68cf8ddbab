import { DEMO_MODEL_DIR } from '../test/helpers/demo-model.js';
import { createEnginePool, type EnginePoolOptions, type WorkerPool } from '../src/engine/pool.js';
import type { GenerationBatch } from '../src/runtime/types.js';
import { median } from './stats.js';

/** What the pool benchmarks share: the embedded model's requests, a pool warmed up on them, and a timed burst. */

/** One image of the demo model, 4 steps as its preset runs. */
const demoRequest = (seed: number, size: number): GenerationBatch => ({
  modelDir: DEMO_MODEL_DIR,
  width: size,
  height: size,
  steps: 4,
  guidanceScale: 0,
  items: [{ prompt: 'a red circle', negativePrompt: '', seed }],
});

/**
 * A CPU pool whose every worker has loaded the demo model and has run a burst like the ones to time
 * (first runs allocate their buffers): timings start warm.
 */
async function warmPool(options: Omit<EnginePoolOptions, 'executionProvider' | 'preload'>, requests: number, size: number): Promise<WorkerPool> {
  const pool = createEnginePool({ ...options, executionProvider: 'cpu', preload: [{ dir: DEMO_MODEL_DIR }] });
  while (!pool.readiness().ready) await new Promise((resolve) => setTimeout(resolve, 20));
  await burst(pool, requests, size);
  return pool;
}

/** Sends `requests` concurrent single-image requests and answers images per second. */
async function burst(pool: WorkerPool, requests: number, size: number): Promise<number> {
  const started = performance.now();
  await Promise.all(Array.from({ length: requests }, (_, i) => pool.generate(demoRequest(i + 1, size))));
  return requests / ((performance.now() - started) / 1000);
}

export type PoolSettings = Omit<EnginePoolOptions, 'executionProvider' | 'preload' | 'queueMax'>;

/**
 * Throughput of each pool configuration under the same bursts: every configuration's pool is started
 * and warmed first, then the rounds take turns among them so that other load on the machine falls on
 * all alike. Answers each configuration's median images per second.
 */
export async function compareConfigurations(configurations: readonly PoolSettings[], burstOf: { requests: number; size: number; rounds: number }): Promise<number[]> {
  const { requests, size, rounds } = burstOf;
  const pools: WorkerPool[] = [];
  try {
    for (const settings of configurations) pools.push(await warmPool({ ...settings, queueMax: requests }, requests, size));
    const rates: number[][] = pools.map(() => []);
    for (let round = 0; round < rounds; round++) {
      for (const [i, pool] of pools.entries()) rates[i].push(await burst(pool, requests, size));
    }
    return rates.map(median);
  } finally {
    await Promise.all(pools.map((pool) => pool.close()));
  }
}
