import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Logger } from 'pino';
import { Piscina } from 'piscina';
import type { EngineSettings } from '../pipelines/run.js';
import { BatchMerger } from './batcher.js';
import { JobQueue } from './job-queue.js';
import type { Engine, GeneratedImage, GenerationBatch, ModelRef } from './types.js';
import type { WorkerEvent, WorkerResult, WorkerTask } from './worker.js';

/**
 * The engine as a pool of worker threads, each keeping its pipelines loaded between jobs. Jobs wait
 * in our own bounded queue (see job-queue.ts) rather than piscina's, which could only cancel a job by
 * terminating its worker. The queue lets as many jobs run as there are workers ready: a worker is
 * ready once it has loaded the models to preload, so requests wait (bounded by the queue's timeout)
 * instead of failing while models load or while a dead worker's replacement starts.
 */

export interface EnginePoolOptions {
  /** Worker threads; each holds its own copy of the models it ran. */
  workers: number;
  /** Jobs that may wait for a free worker; one more gets QueueFullError. */
  queueMax: number;
  /** Longest a job may wait for a worker before it fails with QueueTimeoutError. */
  queueTimeoutMs?: number;
  executionProvider: 'cpu' | 'cuda';
  /** Bytes of model weights all workers together keep loaded (default 60% of RAM). */
  modelMemoryBudget?: number;
  /** CUDA device ids shared out among the workers. */
  cudaDevices?: number[];
  /** Model folders every worker loads before it takes jobs. */
  preload?: ModelRef[];
  /** Most images one merged batch of compatible requests may hold. */
  maxMergedImages?: number;
  logger?: Logger;
  metrics?: EngineMetrics;
}

/** What the engine reports for monitoring; models are named by their folder. */
export interface EngineMetrics {
  queueWait(seconds: number): void;
  batchFinished(batch: { model: string; images: number; steps: number; seconds: number; outcome: BatchOutcome }): void;
  modelLoaded(model: string, seconds: number): void;
  workerReplaced(): void;
}

export type BatchOutcome = 'completed' | 'cancelled' | 'failed' | 'worker_died';

export interface Readiness {
  /** Every worker is up and has loaded every model to preload. */
  ready: boolean;
  workers: { total: number; ready: number };
  /** The models to preload: on how many workers each is loaded, and why its last load failed. */
  models: { model: string; loadedOn: number; error?: string }[];
}

export interface EnginePool extends Engine {
  /** Jobs running and waiting, for /health. */
  load(): { running: number; queued: number };
  /** For /ready. */
  readiness(): Readiness;
}

/** The thread running a batch died (crash, out of memory, terminated); the pool starts a new one. */
export class WorkerDiedError extends Error {
  constructor(cause: unknown) {
    super(`the worker thread running the batch died: ${(cause as Error)?.message ?? String(cause)}`, { cause });
    this.name = 'WorkerDiedError';
  }
}

/** The worker module next to this one, in the same language: worker.ts under tsx/vitest, worker.js when built. */
function workerFile(): { filename: string; execArgv?: string[] } {
  const ext = path.extname(fileURLToPath(import.meta.url));
  const filename = fileURLToPath(new URL(`./worker${ext}`, import.meta.url));
  return ext === '.ts' ? { filename, execArgv: ['--import', 'tsx'] } : { filename };
}

const modelName = (modelDir: string) => path.basename(modelDir);

/** The pool with its test hook. */
export interface WorkerPool extends EnginePool {
  /**
   * Makes the next worker to start a denoising step exit as a crashing worker would. Worker.terminate()
   * cannot stand in for a crash: landing during an ONNX run, it aborts the whole process
   * (onnxruntime-node's completion callback throws once the thread's environment is gone).
   */
  crashWorkerForTest(): void;
}

export function createEnginePool(options: EnginePoolOptions): WorkerPool {
  const { logger, metrics } = options;
  const preload = options.preload ?? [];
  const engine: Partial<EngineSettings> = {
    // Workers share the cores: more threads than cores would only contend.
    runtime: { provider: options.executionProvider, threads: Math.max(1, Math.floor(os.availableParallelism() / options.workers)) },
    // Every worker holds its own copy of the models it uses, so the budget is shared out among them.
    modelMemoryBudget: Math.floor((options.modelMemoryBudget ?? os.totalmem() * 0.6) / options.workers),
  };
  const crash = new Int32Array(new SharedArrayBuffer(4));
  const piscina = new Piscina<WorkerTask, WorkerResult>({
    ...workerFile(),
    minThreads: options.workers,
    maxThreads: options.workers,
    concurrentTasksPerWorker: 1,
    // Piscina's default parks idle workers in a blocking Atomics.wait, which would freeze their preloading.
    atomics: 'disabled',
    // Each worker takes the next number from this shared counter to pick its CUDA device.
    workerData: { engine, cudaDevices: options.cudaDevices ?? [0], workerCounter: new Int32Array(new SharedArrayBuffer(4)), preload, crash },
  });
  const queue = new JobQueue(0, options.queueMax, { maxWaitMs: options.queueTimeoutMs, onStart: (ms) => metrics?.queueWait(ms / 1000) });

  // Thread ids: threads that said they are ready, and threads that loaded each model.
  const readyThreads = new Set<number>();
  const loadedOn = new Map<string, Set<number>>();
  const loadErrors = new Map<string, string>();
  const liveThreads = () => piscina.threads.map((thread) => thread.threadId);
  const readyCount = () => liveThreads().filter((id) => readyThreads.has(id)).length;
  let closing = false;

  piscina.on('message', (message: WorkerEvent) => {
    switch (message.event) {
      case 'ready':
        readyThreads.add(message.threadId);
        logger?.info({ threadId: message.threadId }, 'worker ready');
        break;
      case 'model-loaded':
        loadedOn.set(message.modelDir, (loadedOn.get(message.modelDir) ?? new Set()).add(message.threadId));
        loadErrors.delete(message.modelDir);
        metrics?.modelLoaded(modelName(message.modelDir), message.seconds);
        logger?.info({ threadId: message.threadId, model: modelName(message.modelDir), loadMs: Math.round(message.seconds * 1000) }, 'model loaded');
        break;
      case 'model-load-failed':
        loadErrors.set(message.modelDir, message.message);
        logger?.error({ threadId: message.threadId, model: modelName(message.modelDir), error: message.message }, 'model failed to load');
        break;
    }
    queue.setConcurrency(readyCount());
  });
  piscina.on('workerDestroy', () => {
    if (closing) return;
    logger?.error('a worker thread died; starting a replacement (requests it was running fail with 500)');
    metrics?.workerReplaced();
    // Piscina drops the dead thread from its list right after this event.
    queueMicrotask(() => queue.setConcurrency(readyCount()));
  });
  // A thread that fails while idle has no task to fail; without a listener the error would crash the server.
  piscina.on('error', (err) => logger?.error({ err }, 'worker thread error'));

  async function runOnWorker(batch: GenerationBatch, cancel: Int32Array): Promise<GeneratedImage[]> {
    const progress = new Int32Array(new SharedArrayBuffer(4));
    const started = performance.now();
    let outcome: BatchOutcome = 'failed';
    let images = 0;
    try {
      let result: WorkerResult;
      try {
        result = await piscina.run({ batch, cancel, progress });
      } catch (err) {
        outcome = 'worker_died';
        throw new WorkerDiedError(err);
      }
      if ('error' in result) {
        if (Atomics.load(cancel, 0) === 1) outcome = 'cancelled';
        throw result.error;
      }
      outcome = 'completed';
      images = result.images.length;
      return result.images;
    } finally {
      const seconds = (performance.now() - started) / 1000;
      const steps = Atomics.load(progress, 0);
      metrics?.batchFinished({ model: modelName(batch.modelDir), images, steps, seconds, outcome });
      logger?.debug({ model: modelName(batch.modelDir), size: `${batch.width}x${batch.height}`, items: batch.items.length, steps, runMs: Math.round(seconds * 1000), outcome }, 'batch finished');
    }
  }

  const merger = new BatchMerger((job, signal) => queue.run(job, signal), runOnWorker, options.maxMergedImages ?? 16);

  return {
    generate: (batch, signal) => merger.generate(batch, signal),
    load: () => queue.load(),
    readiness() {
      const threads = liveThreads();
      const models = preload.map(({ dir }) => ({
        model: modelName(dir),
        loadedOn: threads.filter((id) => loadedOn.get(dir)?.has(id)).length,
        ...(loadErrors.has(dir) && { error: loadErrors.get(dir) }),
      }));
      const ready = readyCount();
      return {
        ready: threads.length === options.workers && ready === threads.length && models.every((m) => m.loadedOn === threads.length),
        workers: { total: options.workers, ready },
        models,
      };
    },
    crashWorkerForTest: () => Atomics.store(crash, 0, 1),
    async close() {
      closing = true;
      queue.close();
      await piscina.close();
    },
  };
}
