import { expect } from 'vitest';
import type { WorkerPool } from '../../src/engine/pool.js';

/**
 * Holds the batch a worker runs where it is (past its first step), for a test whose request must still be
 * running when it asks its next questions (of the queue behind it, of a client leaving it): a batch of a
 * fixed size ends sooner the faster the machine, before those questions on one fast enough. The worker
 * process is stopped (SIGSTOP, every thread of it) until `resume` (SIGCONT); the pool notices nothing (its
 * stall watchdog waits WORKER_STALL_TIMEOUT_SECONDS, ten minutes by default). Returns `resume`, which may
 * be called again.
 */
export async function holdBusyWorker(engine: WorkerPool): Promise<() => void> {
  // Past its first step, which the pool has heard of and passed on (a stream's first step event). That
  // step holds the text encoders and the first run at the batch's size: slow on a busy machine, and given
  // the minute the playground's own wait for it had.
  const busy = () => engine.workers().find((worker) => worker.busy && worker.step > 0 && worker.pid !== undefined)?.pid;
  await expect.poll(busy, { timeout: 60_000, interval: 5 }).toBeDefined();
  const pid = busy()!;
  process.kill(pid, 'SIGSTOP');
  let held = true;
  return () => {
    if (!held) return;
    held = false;
    try {
      process.kill(pid, 'SIGCONT');
    } catch (err) {
      // Gone meanwhile (killed by the test, or the pool closed): nothing to resume.
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
    }
  };
}
