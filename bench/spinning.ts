/**
 * What stopping onnxruntime's threads from spin-waiting buys: bursts of concurrent single-image
 * requests through the real worker pool, with 1 and 2 workers, threads spinning (onnxruntime's
 * default: the baseline) and not (ORT_THREAD_SPINNING=false, ours). Every configuration is warmed
 * first, and the rounds take turns among them (see compareConfigurations); each prints its median.
 *
 *   npx tsx bench/spinning.ts [--requests 32] [--size 512] [--rounds 5]
 */
import os from 'node:os';
import { benchFlags, wholeNumber } from './flags.js';
import { compareConfigurations } from './pool-load.js';

const { values } = benchFlags({ options: { requests: { type: 'string', default: '32' }, size: { type: 'string', default: '512' }, rounds: { type: 'string', default: '5' } } });
const [requests, size, rounds] = (['requests', 'size', 'rounds'] as const).map((flag) => wholeNumber(flag, values[flag]));

const configurations = [1, 2].flatMap((workers) => [true, false].map((threadSpinning) => ({ workers, threadSpinning })));
const rates = await compareConfigurations(configurations, { requests, size, rounds });

console.log(`${requests} concurrent requests, ${size}x${size}, 4 steps, demo model, ${os.availableParallelism()} cores, median of ${rounds} rounds`);
for (const workers of [1, 2]) {
  const [spinning, quiet] = [true, false].map((s) => rates[configurations.findIndex((c) => c.workers === workers && c.threadSpinning === s)]);
  console.log(`  ${workers} worker(s), threads spinning (baseline): ${spinning.toFixed(1)} images/s`);
  console.log(`  ${workers} worker(s), threads not spinning:        ${quiet.toFixed(1)} images/s   x${(quiet / spinning).toFixed(2)}`);
}
