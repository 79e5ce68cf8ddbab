import { expect } from 'vitest';
import type { WorkerPool } from '../../src/engine/pool.js';

/**
 * Signals to a worker process of a pool in the middle of its denoising loop. SIGSTOP holds its batch
 * where it is until SIGCONT: what a test must do while a batch runs then happens while it runs, on a
 * machine fast enough to have finished the batch first as on a slow one.
 */

/**
 * Sends `signal`, as the kernel, a native fault or a test holding the batch would, to a worker in the
 * middle of its denoising loop, once `busy` workers run; answers its pid.
 */
export async function signalBusyWorker(engine: Pick<WorkerPool, 'workers'>, signal: NodeJS.Signals, busy = 1): Promise<number> {
  await expect.poll(() => engine.workers().filter((w) => w.busy).length, { timeout: 10_000, interval: 5 }).toBe(busy);
  const midway = () => engine.workers().find((w) => w.busy && w.step > 0);
  // Its first step holds the text encoders and the first run at this size: seconds on a busy machine.
  await expect.poll(midway, { timeout: 30_000, interval: 1 }).toBeTruthy();
  const victim = midway()!.pid!;
  process.kill(victim, signal);
  return victim;
}

/**
 * Runs `meanwhile` (given the worker's pid) with the batch a worker of `engine` is denoising held
 * (SIGSTOP), then lets the batch go on (SIGCONT), also when `meanwhile` fails; answers what it does.
 */
export async function whileBatchHeld<T>(engine: Pick<WorkerPool, 'workers'>, meanwhile: (pid: number) => Promise<T>): Promise<T> {
  const held = await signalBusyWorker(engine, 'SIGSTOP');
  try {
    return await meanwhile(held);
  } finally {
    process.kill(held, 'SIGCONT');
  }
}
