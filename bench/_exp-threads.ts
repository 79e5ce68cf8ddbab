import { compareConfigurations } from './pool-load.js';
// Each configuration: workers, merging, threads per worker (via EXP_THREADS read as the pool starts).
const configs = [
  { workers: 1, threads: 2, merge: undefined },
  { workers: 2, threads: 1, merge: 4 },
  { workers: 2, threads: 2, merge: 4 },
];
async function rates(burst: { requests: number; size: number; rounds: number }) {
  const out: number[] = [];
  // One pool at a time here (the env var is read as a pool starts), each warmed; rounds interleave poorly but it is an experiment.
  for (const c of configs) {
    process.env.EXP_THREADS = String(c.threads);
    const [r] = await compareConfigurations([{ workers: c.workers, ...(c.merge && { maxMergedImages: c.merge }) }], burst);
    out.push(r);
  }
  return out;
}
for (let i = 0; i < 2; i++) {
  const load = await rates({ requests: 16, size: 512, rounds: 3 });
  const alone = await rates({ requests: 1, size: 512, rounds: 15 });
  configs.forEach((c, k) => console.log(`${c.workers}x${c.threads} merge ${c.merge ?? 16}: burst ${load[k].toFixed(1)} img/s, alone ${(1000 / alone[k]).toFixed(1)} ms`));
}
