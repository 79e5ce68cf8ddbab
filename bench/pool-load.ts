import { EMBEDDED_MODELS_DIR } from '../src/config.js';
import { createEnginePool, type EnginePoolOptions, type WorkerPool } from '../src/engine/pool.js';
import type { GenerationBatch } from '../src/runtime/types.js';

/** What the pool benchmarks share: the embedded model's requests, a pool warmed up on them, and a timed burst. */

export const DEMO_MODEL_DIR = `${EMBEDDED_MODELS_DIR}demo-shapes`;

/** One image of the demo model, 4 steps as its preset runs. */
export const demoRequest = (seed: number, size: number): GenerationBatch => ({
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
export async function warmPool(options: Omit<EnginePoolOptions, 'executionProvider' | 'preload'>, requests: number, size: number): Promise<WorkerPool> {
  const pool = createEnginePool({ ...options, executionProvider: 'cpu', preload: [{ dir: DEMO_MODEL_DIR }] });
  while (!pool.readiness().ready) await new Promise((resolve) => setTimeout(resolve, 20));
  await burst(pool, requests, size);
  return pool;
}

/** Sends `requests` concurrent single-image requests and answers images per second. */
export async function burst(pool: WorkerPool, requests: number, size: number): Promise<number> {
  const started = performance.now();
  await Promise.all(Array.from({ length: requests }, (_, i) => pool.generate(demoRequest(i + 1, size))));
  return requests / ((performance.now() - started) / 1000);
}
