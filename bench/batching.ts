/**
 * What merging compatible requests buys: the same burst of concurrent single-image requests through
 * the real worker pool, once with merging off (each request its own denoising loop: the baseline) and
 * once with it on, printed side by side.
 *
 *   npx tsx bench/batching.ts [--requests 32] [--size 512] [--workers 1]
 */
import { parseArgs } from 'node:util';
import { EMBEDDED_MODELS_DIR } from '../src/config.js';
import { createEnginePool } from '../src/engine/pool.js';
import type { GenerationBatch } from '../src/engine/types.js';

const { values } = parseArgs({ options: { requests: { type: 'string', default: '32' }, size: { type: 'string', default: '512' }, workers: { type: 'string', default: '1' } } });
const [requests, size, workers] = [Number(values.requests), Number(values.size), Number(values.workers)];

const request = (seed: number): GenerationBatch => ({
  modelDir: `${EMBEDDED_MODELS_DIR}demo-shapes`,
  width: size,
  height: size,
  steps: 4,
  guidanceScale: 0,
  outputFormat: 'png',
  items: [{ prompt: 'a red circle', negativePrompt: '', seed }],
});

async function measure(maxMergedImages: number): Promise<number> {
  const pool = createEnginePool({ workers, queueMax: requests, executionProvider: 'cpu', maxMergedImages });
  try {
    await pool.generate(request(0)); // load the model in every worker before timing
    const started = performance.now();
    await Promise.all(Array.from({ length: requests }, (_, i) => pool.generate(request(i + 1))));
    return requests / ((performance.now() - started) / 1000);
  } finally {
    await pool.close();
  }
}

const baseline = await measure(1);
const merged = await measure(16);
console.log(`${requests} concurrent requests, ${size}x${size}, 4 steps, demo model, ${workers} worker(s)`);
console.log(`  one loop per request (baseline): ${baseline.toFixed(1)} images/s`);
console.log(`  merged batches (up to 16):       ${merged.toFixed(1)} images/s   x${(merged / baseline).toFixed(2)}`);
