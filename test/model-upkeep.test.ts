import { describe, expect, it } from 'vitest';
import { whileBatchHeld } from './helpers/busy-worker.js';
import { demoBatch, DEMO_MODEL_DIR } from './helpers/demo-model.js';
import { withDemoPool } from './helpers/demo-pool.js';
import { capturedLogs } from './helpers/logs.js';

/**
 * The pool's upkeep of the models its workers hold (engine/model-upkeep.ts), with the real worker
 * process: here, releasing a model whose folder the scan no longer finds usable. `gone` stands for the
 * model scan: while true, the demo model has no usable version.
 */

/** A model scan the test controls: the demo model is installed until `gone` is set. */
function scan() {
  const state = { gone: false };
  return { state, modelVersion: (dir: string) => (state.gone && dir === DEMO_MODEL_DIR ? undefined : '1') };
}

describe('a worker that hangs releasing a model that is gone', () => {
  it('is killed by the stall watchdog, as one whose batch hangs is, and replaced: it does not hold its worker for good', async () => {
    const logs = capturedLogs<{ msg: string }>();
    const { state, modelVersion } = scan();
    await withDemoPool(
      async (pool) => {
        const [{ pid }] = pool.workers();
        // Stopped before the release reaches it, as a deadlock in native code would hold it.
        process.kill(pid!, 'SIGSTOP');
        state.gone = true;
        // Before, the release had no watchdog: the worker stayed busy with it, and served nothing again.
        await expect.poll(() => pool.workers()[0]?.pid, { timeout: 30_000, interval: 50 }).not.toBe(pid);
        // What it was doing: before, a death during a load or a release was said to be "while idle".
        expect(logs.lines.map((line) => line.msg)).toContain("worker process made no progress for 2 s and was killed while releasing model 'demo-shapes'; starting a replacement");
        state.gone = false;
        await expect.poll(() => pool.readiness().ready, { timeout: 60_000, interval: 20 }).toBe(true);
        expect(await pool.generate(demoBatch({ width: 256, height: 256, steps: 2 }))).toHaveLength(1);
      },
      { modelVersion, stallTimeoutMs: 2000, logger: logs.logger },
    );
  });
});

describe('a release waiting for a worker a batch holds', () => {
  it("is no client's job: it takes no place in the queue, in its count, or in a keyless client's line", async () => {
    const { state, modelVersion } = scan();
    await withDemoPool(
      async (pool) => {
        const leave = new AbortController();
        const batch = pool.generate(demoBatch({ width: 256, height: 256, steps: 100_000 }), leave.signal);
        await whileBatchHeld(pool, async () => {
          state.gone = true;
          // One of the upkeep's looks (every 2 s, a timer of this process due before this one) with the only
          // worker busy. Before, it queued the release as a keyless client's job: /health counted it, and with
          // QUEUE_MAX 1 a keyless request got 429.
          await new Promise((resolve) => setTimeout(resolve, 2500));
          expect(pool.load()).toEqual({ running: 1, queued: 0 });
          expect(pool.wouldRefuse()).toBeUndefined();
        });
        leave.abort(new Error('the client left'));
        await expect(batch).rejects.toThrow('the client left');
        // Once the worker is free, the release runs.
        await expect.poll(() => pool.modelsHeld(), { timeout: 20_000, interval: 50 }).toEqual({});
      },
      { modelVersion, queueMax: 1 },
    );
  });
});
