import { mkdtemp, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import type { BatchOutcome, EngineMetrics } from '../src/engine/pool.js';
import { WORKER_SCRIPT } from './helpers/cli.js';
import { demoBatch } from './helpers/demo-model.js';
import { withDemoPool } from './helpers/demo-pool.js';

/**
 * A worker's batches back to back, when the worker hears that its last answer ('done', 'failed') was
 * written only after the pool already handed it the next batch: an answer of megabytes of images is
 * written as the server reads it, and a worker at a lower CPU priority (WORKER_NICE) may run its write's
 * callback late. The next batch must still be the one a cancel or a stop reaches.
 */

/** How late the worker hears that its answers were written. */
const LATE_MS = 300;

/** A worker module that is the built one, with its batches' answers' writes heard LATE_MS late. */
async function lateWriteWorker(): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'late-write-worker-'));
  const file = path.join(dir, 'worker.mjs');
  await writeFile(
    file,
    `const send = process.send.bind(process);
process.send = (message, handle, options, callback) =>
  send(message, handle, options, ['done', 'failed'].includes(message?.type) ? () => setTimeout(() => callback?.(), ${LATE_MS}) : callback);
await import(${JSON.stringify(pathToFileURL(WORKER_SCRIPT).href)});
`,
  );
  return file;
}

function outcomes(): { outcomes: BatchOutcome[]; metrics: EngineMetrics } {
  const outcomes: BatchOutcome[] = [];
  const none = () => undefined;
  const metrics: EngineMetrics = {
    queueWait: none,
    batchFinished: ({ outcome }) => void outcomes.push(outcome),
    partialImage: none,
    memoryWaited: none,
    modelLoaded: none,
    workerReplaced: none,
  };
  return { outcomes, metrics };
}

describe('a batch handed to a worker before it heard its last answer was written', () => {
  it('stops at its next step when its clients leave', async () => {
    const { outcomes: ended, metrics } = outcomes();
    await withDemoPool(async (pool) => {
      // Two batches that do not merge (their steps differ): the second goes to the worker as the first's images arrive.
      const first = pool.generate(demoBatch({ width: 256, height: 256, steps: 1 }));
      const leave = new AbortController();
      let begun = 0;
      const second = pool.generate(demoBatch({ width: 256, height: 256, steps: 100_000 }), leave.signal, undefined, (event) => {
        if (event.type !== 'step') return;
        begun ||= performance.now();
        // Past the late write of the first batch's answer.
        if (performance.now() - begun > 2 * LATE_MS) leave.abort(new Error('the client left'));
      });
      expect(await first).toHaveLength(1);
      await expect(second).rejects.toThrow('the client left');
      await expect.poll(() => ended.length, { timeout: 60_000 }).toBe(2);
      expect(ended).toEqual(['completed', 'cancelled']);
      expect(pool.workers()[0].step).toBeLessThan(100_000);
    }, { metrics, workerScript: await lateWriteWorker() });
  });
});
