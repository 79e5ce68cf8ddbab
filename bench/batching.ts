/**
 * What merging compatible requests buys: the same bursts of concurrent single-image requests through
 * the real worker pool, with merging off (each request its own denoising loop: the baseline) and on,
 * both pools warmed before either is timed and the rounds taking turns (see compareConfigurations).
 * `npm run bench` compares the full set of configurations, the default among them.
 *
 *   npx tsx bench/batching.ts [--requests 32] [--size 512] [--workers 1] [--max-merged 16] [--rounds 3]
 */
import { benchFlags, wholeNumber } from './flags.js';
import { compareConfigurations } from './pool-load.js';

const { values } = benchFlags({
  options: { requests: { type: 'string', default: '32' }, size: { type: 'string', default: '512' }, workers: { type: 'string', default: '1' }, 'max-merged': { type: 'string', default: '16' }, rounds: { type: 'string', default: '3' } },
});
const [requests, size, workers, maxMerged, rounds] = (['requests', 'size', 'workers', 'max-merged', 'rounds'] as const).map((flag) => wholeNumber(flag, values[flag]));

const [baseline, merged] = await compareConfigurations([{ workers, maxMergedImages: 1 }, { workers, maxMergedImages: maxMerged }], { requests, size, rounds });
console.log(`${requests} concurrent requests, ${size}x${size}, 4 steps, demo model, ${workers} worker(s), median of ${rounds} rounds`);
console.log(`  one loop per request (baseline): ${baseline.toFixed(1)} images/s`);
console.log(`  merged batches (up to ${maxMerged}):${' '.repeat(Math.max(1, 7 - String(maxMerged).length))}${merged.toFixed(1)} images/s   x${(merged / baseline).toFixed(2)}`);
