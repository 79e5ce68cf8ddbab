/**
 * What merging compatible requests buys: the same burst of concurrent single-image requests through
 * the real worker pool, once with merging off (each request its own denoising loop: the baseline) and
 * once with it on, printed side by side.
 *
 *   npx tsx bench/batching.ts [--requests 32] [--size 512] [--workers 1]
 */
import { parseArgs } from 'node:util';
import { burst, warmPool } from './pool-load.js';

const { values } = parseArgs({ options: { requests: { type: 'string', default: '32' }, size: { type: 'string', default: '512' }, workers: { type: 'string', default: '1' } } });
const [requests, size, workers] = [Number(values.requests), Number(values.size), Number(values.workers)];

async function measure(maxMergedImages: number): Promise<number> {
  const pool = await warmPool({ workers, queueMax: requests, maxMergedImages }, requests, size);
  try {
    return await burst(pool, requests, size);
  } finally {
    await pool.close();
  }
}

const baseline = await measure(1);
const merged = await measure(16);
console.log(`${requests} concurrent requests, ${size}x${size}, 4 steps, demo model, ${workers} worker(s)`);
console.log(`  one loop per request (baseline): ${baseline.toFixed(1)} images/s`);
console.log(`  merged batches (up to 16):       ${merged.toFixed(1)} images/s   x${(merged / baseline).toFixed(2)}`);
