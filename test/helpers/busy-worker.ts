import { expect } from 'vitest';
import type { WorkerPool } from '../../src/engine/pool.js';

/**
 * Signals to a worker process of a pool in the middle of its denoising loop. SIGSTOP holds its batch
 * where it is (every thread of the process) until SIGCONT: what a test must do while a batch runs then
 * happens while it runs, on a machine fast enough to have finished the batch first as on a slow one.
 * The pool notices nothing: its stall watchdog waits WORKER_STALL_TIMEOUT_SECONDS (ten minutes unless
 * a test sets it).
 */

/**
 * Sends `signal`, as the kernel, a native fault or a test holding the batch would, to a worker past its
 * first denoising step (one the pool has heard of and passed on, as a stream's first step event), once
 * `busy` workers run; answers its pid.
 */
export async function signalBusyWorker(engine: Pick<WorkerPool, 'workers'>, signal: NodeJS.Signals, busy = 1): Promise<number> {
  await expect.poll(() => engine.workers().filter((w) => w.busy).length, { timeout: 10_000, interval: 5 }).toBe(busy);
  const midway = () => engine.workers().find((w) => w.busy && w.step > 0 && w.pid !== undefined);
  // Its first step holds the text encoders and the first run at this size: slow on a busy machine.
  await expect.poll(midway, { timeout: 60_000, interval: 1 }).toBeTruthy();
  const victim = midway()!.pid!;
  process.kill(victim, signal);
  return victim;
}

/**
 * Holds the batch a worker of `engine` is denoising (SIGSTOP) and answers `resume` (SIGCONT), which may
 * be called again, and does nothing for a worker gone meanwhile (killed by the test, or the pool closed).
 */
export async function holdBusyWorker(engine: Pick<WorkerPool, 'workers'>): Promise<() => void> {
  const pid = await signalBusyWorker(engine, 'SIGSTOP');
  let held = true;
  return () => {
    if (!held) return;
    held = false;
    try {
      process.kill(pid, 'SIGCONT');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
    }
  };
}

/** Runs `meanwhile` with the batch a worker of `engine` is denoising held, then lets it go on, also when `meanwhile` fails; answers what it does. */
export async function whileBatchHeld<T>(engine: Pick<WorkerPool, 'workers'>, meanwhile: () => Promise<T>): Promise<T> {
  const resume = await holdBusyWorker(engine);
  try {
    return await meanwhile();
  } finally {
    resume();
  }
}
