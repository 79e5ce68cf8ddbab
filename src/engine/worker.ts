import { parentPort, threadId, workerData } from 'node:worker_threads';
import { configureEngine, getPipeline, holdsModel, runBatch, type EngineSettings } from '../pipelines/run.js';
import type { GeneratedImage, GenerationBatch, ModelRef } from './types.js';

/**
 * A piscina worker thread: the engine's settings arrive as workerData, batches as tasks. Before it
 * takes its first task the worker loads the models to preload, so no request pays for that; it tells
 * the pool about every model it loads and when it is ready (see WorkerEvent).
 */

interface WorkerData {
  engine: Partial<EngineSettings>;
  cudaDevices: number[];
  workerCounter: Int32Array;
  /** Model folders to load before the worker says it is ready. */
  preload: ModelRef[];
  /** Test hook, see WorkerPool.crashWorkerForTest: 1 makes the next worker to reach a step exit. */
  crash: Int32Array;
}

const data = workerData as WorkerData;
const workerIndex = Atomics.add(data.workerCounter, 0, 1);
const deviceId = data.cudaDevices[workerIndex % data.cudaDevices.length];
configureEngine({ ...data.engine, runtime: { provider: 'cpu', ...data.engine.runtime, deviceId } });

export interface WorkerTask {
  batch: GenerationBatch;
  /** Shared with the pool: 1 means every client of this batch left, stop at the next step. */
  cancel: Int32Array;
  /** Written by the worker: denoising steps done so far (for metrics, also when stopped early). */
  progress: Int32Array;
}

/**
 * The task's outcome. A failed generation comes back as a value rather than a rejection, so that a
 * rejected task means one thing only: the thread died under it.
 */
export type WorkerResult = { images: GeneratedImage[] } | { error: unknown };

/** Messages to the pool (piscina re-emits them as its 'message' event). */
export type WorkerEvent =
  | { event: 'model-loaded'; threadId: number; modelDir: string; seconds: number }
  | { event: 'model-load-failed'; threadId: number; modelDir: string; message: string }
  | { event: 'ready'; threadId: number };

const report = (event: WorkerEvent) => parentPort!.postMessage(event);

/** Loads a model unless this worker holds it, reporting the load (also a reload after an eviction). */
async function ensureLoaded(modelDir: string, version?: string): Promise<void> {
  if (holdsModel(modelDir, version)) return;
  const started = performance.now();
  try {
    await getPipeline(modelDir, version);
  } catch (err) {
    report({ event: 'model-load-failed', threadId, modelDir, message: (err as Error).message });
    throw err;
  }
  report({ event: 'model-loaded', threadId, modelDir, seconds: (performance.now() - started) / 1000 });
}

/**
 * Runs beside piscina's start-up rather than as a top-level await, which the worker module cannot use:
 * under tsx piscina loads it with require(). The pool sends no task before 'ready'. A model that fails
 * to preload is reported by ensureLoaded; requests for it retry the load and get its error.
 */
async function preload(): Promise<void> {
  for (const { dir, version } of data.preload) await ensureLoaded(dir, version).catch(() => undefined);
  report({ event: 'ready', threadId });
}

// piscina may hand this worker a task as soon as the module is imported, before preloading ended:
// tasks wait for it, so that one thread never loads the same model twice at once.
const preloaded = preload();

export default async function generate({ batch, cancel, progress }: WorkerTask): Promise<WorkerResult> {
  try {
    await preloaded;
    await ensureLoaded(batch.modelDir, batch.modelVersion);
    const images = await runBatch(batch, {
      shouldStop: () => {
        if (Atomics.compareExchange(data.crash, 0, 1, 0) === 1) process.exit(70);
        return Atomics.load(cancel, 0) === 1;
      },
      onStep: (step) => Atomics.store(progress, 0, step),
    });
    return { images };
  } catch (error) {
    return { error };
  }
}
