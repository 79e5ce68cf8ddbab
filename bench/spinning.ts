/**
 * What stopping onnxruntime's threads from spin-waiting buys: bursts of concurrent single-image
 * requests through the real worker pool, with 1 and 2 workers, threads spinning (onnxruntime's
 * default: the baseline) and not (ORT_THREAD_SPINNING=false, ours). Every configuration is warmed
 * first, and the rounds take turns among them so that other load on the machine falls on all alike;
 * each prints its median.
 *
 *   npx tsx bench/spinning.ts [--requests 32] [--size 512] [--rounds 5]
 */
import os from 'node:os';
import { parseArgs } from 'node:util';
import type { WorkerPool } from '../src/engine/pool.js';
import { burst, warmPool } from './pool-load.js';

const { values } = parseArgs({ options: { requests: { type: 'string', default: '32' }, size: { type: 'string', default: '512' }, rounds: { type: 'string', default: '5' } } });
const [requests, size, rounds] = [Number(values.requests), Number(values.size), Number(values.rounds)];

interface Configuration {
  workers: number;
  spinning: boolean;
  pool: WorkerPool;
  rates: number[];
}

const configurations: Configuration[] = [];
for (const workers of [1, 2]) {
  for (const spinning of [true, false]) {
    configurations.push({ workers, spinning, pool: await warmPool({ workers, queueMax: requests, threadSpinning: spinning }, requests, size), rates: [] });
  }
}
try {
  for (let round = 0; round < rounds; round++) {
    for (const c of configurations) c.rates.push(await burst(c.pool, requests, size));
  }
} finally {
  await Promise.all(configurations.map((c) => c.pool.close()));
}

const median = (rates: number[]) => [...rates].sort((a, b) => a - b)[Math.floor(rates.length / 2)];
console.log(`${requests} concurrent requests, ${size}x${size}, 4 steps, demo model, ${os.availableParallelism()} cores, median of ${rounds} rounds`);
for (const workers of [1, 2]) {
  const [spinning, quiet] = [true, false].map((s) => median(configurations.find((c) => c.workers === workers && c.spinning === s)!.rates));
  console.log(`  ${workers} worker(s), threads spinning (baseline): ${spinning.toFixed(1)} images/s`);
  console.log(`  ${workers} worker(s), threads not spinning:        ${quiet.toFixed(1)} images/s   x${(quiet / spinning).toFixed(2)}`);
}
