import os from 'node:os';
import { defaultWorkerCount } from '../src/engine/worker-count.js';
import { availableBytes } from '../src/runtime/memory.js';
import { compareConfigurations, type PoolSettings } from './pool-load.js';
import type { Row } from './report.js';

/**
 * Throughput under concurrency: bursts of single-image requests through the real worker pool in the
 * configuration the server starts with by default and in the others worth trying on this machine
 * (workers x threads, merging), each against one sequential worker (one loop per request). Every pool
 * is warmed before any is timed. The goal: the default within 10% of the best configuration found.
 */

const BURST = { requests: 16, size: 512, rounds: 3 };

interface Candidate {
  label: string;
  settings: PoolSettings;
}

function candidates(): { baseline: Candidate; others: Candidate[]; defaultIndex: number } {
  const cores = os.availableParallelism();
  // What serve picks when WORKERS is not set, with no memory figures yet; merging at the pool's default.
  const { workers } = defaultWorkerCount({ provider: 'cpu', cudaDevices: [0], preload: [], measured: {}, availableBytes: availableBytes() });
  const threads = (w: number) => Math.max(1, Math.floor(cores / w));
  const label = (w: number, merge: string) => `${w} worker${w > 1 ? 's' : ''} x ${threads(w)} thread${threads(w) > 1 ? 's' : ''}, ${merge}`;
  const counts = [...new Set([1, 2, cores].filter((w) => w <= cores))];
  const others: Candidate[] = counts.flatMap((w) => [
    { label: label(w, 'merging up to 4'), settings: { workers: w, maxMergedImages: 4 } },
    { label: label(w, 'merging up to 16'), settings: { workers: w } },
  ]);
  others.push({ label: label(cores, 'no merging'), settings: { workers: cores, maxMergedImages: 1 } });
  const defaultIndex = others.findIndex((c) => c.settings.workers === workers && c.settings.maxMergedImages === undefined);
  return { baseline: { label: label(1, 'no merging (sequential)'), settings: { workers: 1, maxMergedImages: 1 } }, others, defaultIndex };
}

export async function measureThroughput(): Promise<Row[]> {
  const { baseline, others, defaultIndex } = candidates();
  const [base, ...rates] = await compareConfigurations([baseline.settings, ...others.map((c) => c.settings)], BURST);
  const perSecond = (rate: number) => `${rate.toFixed(1)} images/s`;
  const what = `${BURST.requests} concurrent x ${BURST.size}x${BURST.size}`;
  const rows: Row[] = others.map((c, i) => ({
    group: 'throughput vs sequential',
    case: `${c.label}${i === defaultIndex ? ' (default)' : ''}`,
    baseline: perSecond(base),
    measured: perSecond(rates[i]),
    ratio: rates[i] / base,
  }));
  const best = rates.indexOf(Math.max(...rates));
  const ratio = rates[defaultIndex] / rates[best];
  rows.push({ group: 'default vs best config', case: `best: ${others[best].label}; ${what}`, baseline: perSecond(rates[best]), measured: perSecond(rates[defaultIndex]), ratio, goal: '>= 0.90', met: ratio >= 0.9 });
  return rows;
}
