import type { ModelMemory } from '../models/memory-figures.js';
import type { MemoryGrant } from './memory-arbiter.js';
import type { EngineSettings } from '../pipelines/run.js';
import type { BatchEvent, GeneratedImage, GenerationBatch, ModelRef } from '../runtime/types.js';

/**
 * The messages between the pool and a worker process, over Node's IPC channel with `advanced`
 * serialization (structured clone: images travel as bytes).
 * A worker runs one batch at a time, so messages about a batch need no id.
 */

/** What a worker is started with (its first message). */
export interface WorkerInit {
  type: 'init';
  /** The runtime's options always: the worker adds its own `warn` to them. */
  engine: Partial<EngineSettings> & Pick<EngineSettings, 'runtime'>;
  /** Model folders to load before the worker says it is ready. */
  preload: ModelRef[];
  /** A Unix nice increment: the worker runs this far below the server's CPU priority, so the server's event loop is never starved of a core. */
  nice: number;
}

export type ToWorker =
  | WorkerInit
  | { type: 'run'; batch: GenerationBatch }
  /** Load a model with no batch (a preload that failed, tried again): answered as a batch with no images. */
  | { type: 'load'; model: ModelRef }
  /** Release a model's sessions (its folder is gone, or no longer usable): answered as a batch with no images. */
  | { type: 'release'; modelDir: string }
  /** The pool's answer to 'memory-ask' and 'memory-wait': what the running batch may plan on (see memory-arbiter.ts). */
  | { type: 'memory-grant'; grant: MemoryGrant }
  /** The pool's figures of a model, all workers' and earlier servers' together, after they changed: the worker plans from them with its own (MemoryPlan.adopt). */
  | { type: 'model-memory'; modelDir: string; memory: ModelMemory }
  /** Every client of the running batch left: stop at the next denoising step. */
  | { type: 'cancel' }
  /** The clients of these items of the running batch left, others staying: they need no image (WorkerRuntime.runMerged). */
  | { type: 'leave'; items: number[] }
  /** Stop the running batch, if any, and exit. */
  | { type: 'stop' };

export type FromWorker =
  | { type: 'model-loaded'; modelDir: string; seconds: number }
  | { type: 'model-load-failed'; modelDir: string; message: string }
  /** Something the server's log should say (a GPU provider that could not start, a rewritten graph that did not load). */
  | { type: 'warning'; message: string }
  /** What a model has cost this worker so far (after its load, and after each batch). */
  | { type: 'model-memory'; modelDir: string; memory: ModelMemory }
  /** Preloading is over; the worker takes batches from now on. */
  | { type: 'ready' }
  /**
   * The worker took the batch (its first answer to 'run'): a process that dies before saying so never
   * ran the batch, which then goes to another worker instead of failing.
   */
  | { type: 'started' }
  /**
   * The running batch's memory plan, with the pool's arbiter (memory-arbiter.ts): asking for a grant,
   * the bytes it took of it (0: none, the batch does not run), or waiting for another batch to end.
   * `exclusive`: for work that takes all there is (a calibration, see MemorySource.exclusive).
   */
  | { type: 'memory-ask'; exclusive?: boolean }
  | { type: 'memory-take'; bytes: number; samples: number }
  | { type: 'memory-wait' }
  /** The work that took memory outside a batch (a calibration, see MemorySource.exclusive) ended: it holds none now. */
  | { type: 'memory-release' }
  /**
   * The running batch's progress and previews (see BatchEvent). `seconds`: since the worker took the
   * batch, by its own clock, less its waits for memory grants and its sessions' loads (see WorkerProcess.seconds).
   */
  | { type: 'event'; event: BatchEvent; seconds: number }
  /**
   * `images`: one per item, none for an item whose client left ('leave'); `held`: the model folders the
   * worker holds once the batch is over (a load may have evicted others, running out of memory released
   * its own); `seconds`: the batch's, as the events'.
   */
  | { type: 'done'; images: (GeneratedImage | undefined)[]; held: string[]; seconds: number }
  /**
   * The batch failed or was cancelled; the worker is fine and takes the next one, unless `ending` says
   * why it exits now instead (a GPU fault that leaves its process unable to use the GPU: see
   * GpuFaultError), to be replaced. `problem`: what is wrong with a model folder that could not be
   * loaded (ModelLayoutError.problem, which names no path).
   */
  | { type: 'failed'; error: { name: string; message: string; stack?: string; problem?: string }; held: string[]; ending?: string };
