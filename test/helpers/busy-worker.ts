import { expect } from 'vitest';
import type { WorkerPool } from '../../src/engine/pool.js';

/**
 * Signals to a worker process of a pool in the middle of its denoising loop, or before it begins a
 * batch. SIGSTOP holds its batch where it is (every thread of the process) until SIGCONT: what a test
 * must do while a batch runs then happens while it runs, on a machine fast enough to have finished the
 * batch first as on a slow one.
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
 * What lets processes held by SIGSTOP go on (SIGCONT): may be called again, and does nothing for a process
 * gone meanwhile (killed by the test, or ended with its pool or server).
 */
function resumer(pids: readonly number[]): () => void {
  let held = true;
  return () => {
    if (!held) return;
    held = false;
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGCONT');
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
      }
    }
  };
}

/** Holds processes where they are (SIGSTOP: every thread of each) and answers what lets them go on (see resumer). */
export function holdProcesses(pids: readonly number[]): () => void {
  for (const pid of pids) process.kill(pid, 'SIGSTOP');
  return resumer(pids);
}

/** Holds the batch a worker of `engine` is denoising (SIGSTOP) and answers what lets it go on (see resumer). */
export async function holdBusyWorker(engine: Pick<WorkerPool, 'workers'>): Promise<() => void> {
  return resumer([await signalBusyWorker(engine, 'SIGSTOP')]);
}

/**
 * Holds the batch `send` starts before its worker can begin it, and answers what `send` answered and
 * `resume`, as holdBusyWorker's. Every idle worker of `engine` is stopped first, and those the pool
 * did not give the batch go on once one has it. holdBusyWorker must catch a batch while it runs: one
 * that takes a tenth of a second can end while a loaded machine stalls the test process, and the catch
 * then waits in vain. Here the worker that has the batch cannot run it until resumed, so nothing can
 * be missed. For a test that needs a worker busy, not a batch midway (with its memory grant and steps).
 */
export async function holdNextBatch<T>(engine: Pick<WorkerPool, 'workers'>, send: () => T): Promise<{ sent: T; resume: () => void }> {
  const idle = engine.workers().flatMap((w) => (w.alive && w.ready && !w.busy && w.pid !== undefined ? [w.pid] : []));
  holdProcesses(idle);
  let taker: number | undefined;
  try {
    const sent = send();
    await expect.poll(() => (taker = engine.workers().find((w) => w.busy && w.pid !== undefined && idle.includes(w.pid))?.pid), { timeout: 30_000, interval: 5 }).toBeDefined();
    return { sent, resume: resumer([taker!]) };
  } finally {
    // Also every one of them when none took the batch: the test fails with no worker left stopped.
    resumer(idle.filter((pid) => pid !== taker))();
  }
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
