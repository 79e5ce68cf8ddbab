/** Small statistics shared by the benchmarks. */

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

/** Milliseconds one call takes. */
export async function timed(run: () => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await run();
  return performance.now() - started;
}

/**
 * Times each of `runs` `rounds` times, taking turns (a, b, a, b, ...) so that other load on the machine
 * falls on all of them alike, and answers each one's median in milliseconds.
 */
export async function sideBySide(runs: readonly (() => Promise<unknown>)[], rounds: number): Promise<number[]> {
  const times: number[][] = runs.map(() => []);
  for (let round = 0; round < rounds; round++) {
    for (const [i, run] of runs.entries()) times[i].push(await timed(run));
  }
  return times.map(median);
}

export const ms = (value: number) => `${value < 10 ? value.toFixed(2) : value.toFixed(0)} ms`;
