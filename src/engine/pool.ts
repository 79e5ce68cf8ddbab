import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Piscina } from 'piscina';
import type { EngineSettings } from '../pipelines/run.js';
import { BatchMerger } from './batcher.js';
import { JobQueue } from './job-queue.js';
import type { Engine, GeneratedImage } from './types.js';
import type { WorkerTask } from './worker.js';

/**
 * The engine as a pool of worker threads, each keeping its pipelines loaded between jobs. Jobs wait
 * in our own bounded queue (see job-queue.ts) rather than piscina's, which could only cancel a job by
 * terminating its worker.
 */

export interface EnginePoolOptions {
  /** Worker threads; each holds its own copy of the models it ran. */
  workers: number;
  /** Jobs that may wait for a free worker; one more gets QueueFullError. */
  queueMax: number;
  executionProvider: 'cpu' | 'cuda';
  /** CUDA device ids shared out among the workers. */
  cudaDevices?: number[];
  /** Most images one merged batch of compatible requests may hold. */
  maxMergedImages?: number;
}

export interface EnginePool extends Engine {
  /** Jobs running and waiting, for /health. */
  load(): { running: number; queued: number };
}

/** The worker module next to this one, in the same language: worker.ts under tsx/vitest, worker.js when built. */
function workerFile(): { filename: string; execArgv?: string[] } {
  const ext = path.extname(fileURLToPath(import.meta.url));
  const filename = fileURLToPath(new URL(`./worker${ext}`, import.meta.url));
  return ext === '.ts' ? { filename, execArgv: ['--import', 'tsx'] } : { filename };
}

export function createEnginePool(options: EnginePoolOptions): EnginePool {
  const engine: Partial<EngineSettings> = {
    // Workers share the cores: more threads than cores would only contend.
    runtime: { provider: options.executionProvider, threads: Math.max(1, Math.floor(os.availableParallelism() / options.workers)) },
  };
  const piscina = new Piscina<WorkerTask, GeneratedImage[]>({
    ...workerFile(),
    minThreads: options.workers,
    maxThreads: options.workers,
    concurrentTasksPerWorker: 1,
    // Each worker takes the next number from this shared counter to pick its CUDA device.
    workerData: { engine, cudaDevices: options.cudaDevices ?? [0], workerCounter: new Int32Array(new SharedArrayBuffer(4)) },
  });
  const queue = new JobQueue(options.workers, options.queueMax);
  const merger = new BatchMerger(
    (job, signal) => queue.run(job, signal),
    (batch, cancel) => piscina.run({ batch, cancel }),
    options.maxMergedImages ?? 16,
  );

  return {
    generate: (batch, signal) => merger.generate(batch, signal),
    load: () => queue.load(),
    async close() {
      queue.close();
      await piscina.close();
    },
  };
}
