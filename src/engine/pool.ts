import os from 'node:os';
import { isDeepStrictEqual } from 'node:util';
import type { Logger } from 'pino';
import { MODEL_BUDGET_SHARE, type EngineSettings } from '../pipelines/run.js';
import { exceededFigures, type ModelMemory } from '../models/memory-figures.js';
import { BatchMerger } from './batcher.js';
import { CostModel } from './cost-model.js';
import type { LeftItems } from './left-items.js';
import { MemoryArbiter } from './memory-arbiter.js';
import { cgroupOomKills } from '../runtime/cgroup-memory.js';
import { HEADROOM, plannableBytes, residentBytesOf } from '../runtime/memory.js';
import { JobQueue, RequeueError, Ticket, type ClientLimits, type QueueClosedError, type QueueFullError } from './job-queue.js';
import type { ExecutionProvider, GraphRewrites } from '../runtime/providers.js';
import type { BatchEvent, GeneratedImage, GenerationBatch, ModelRef } from '../runtime/types.js';
import { startModelUpkeep } from './model-upkeep.js';
import { stallWatchdog } from './stall-watchdog.js';
import { modelName, WorkerDiedError, type WorkerProcess } from './worker-process.js';
import type { WorkerInit } from './worker-protocol.js';
import { cudaDeviceOf } from './worker-count.js';
import { REAL_CLOCK, WorkerSlots, type PoolClock, type PoolMessage, type Readiness, type SlotMetrics } from './worker-slots.js';

/**
 * The engine as a pool of worker processes (worker-slots.ts), each keeping its pipelines loaded between jobs. Jobs wait
 * in a bounded queue (see job-queue.ts) that lets as many jobs run as there are workers ready: a
 * worker is ready once it has loaded the models to preload, so requests wait (bounded by the queue's
 * timeout) instead of failing while models load or while a dead worker's replacement starts.
 * The queue weighs each batch by its estimated seconds (cost-model.ts, learned from the batches that
 * finished here) to keep clients fair to each other and to answer 429 with a Retry-After that reflects
 * the work ahead. What the workers hold outside requests (a preload that failed loaded again, a removed
 * model released) is kept in order by model-upkeep.ts.
 */

export interface EnginePoolOptions {
  /** Worker processes; each holds its own copy of the models it ran. */
  workers: number;
  /** Jobs that may wait for a free worker; one more gets QueueFullError. */
  queueMax: number;
  /** Longest a request may wait for its first batch to get a worker before it fails with QueueTimeoutError. */
  queueTimeoutMs?: number;
  /** Most estimated seconds of work that may wait per worker before new requests get QueueFullError. */
  queueMaxSeconds?: number;
  executionProvider: ExecutionProvider;
  /** onnxruntime's intra-op CPU threads in each worker; default: the cores shared out among the workers. */
  threadsPerWorker?: number;
  /** Whether onnxruntime's CPU threads spin-wait for work (see RuntimeOptions.spinning); default false. */
  threadSpinning?: boolean;
  /** Which graph rewrites the workers' graphs get (see RuntimeOptions.graphRewrites); default all. */
  graphRewrites?: GraphRewrites;
  /** How far below the server's the workers' CPU priority is (see WorkerInit.nice); default 0. */
  workerNice?: number;
  /** Whether the workers' malloc asks for transparent huge pages (see malloc-tunables.ts); default true. */
  mallocHugePages?: boolean;
  /** Bytes of model weights all workers together keep loaded (default 60% of RAM). */
  modelMemoryBudget?: number;
  /** Most memory the running batches of all workers may plan to take together on top of their models (default: what is free). */
  memoryLimit?: number;
  /** When the VAE decodes in tiles (see VaeTilingMode); default 'auto'. */
  vaeTiling?: EngineSettings['vaeTiling'];
  /** CUDA device ids shared out among the workers. */
  cudaDevices?: number[];
  /** Model folders every worker loads before it takes jobs. */
  preload?: ModelRef[];
  /** See WorkerSlotsOptions.modelVersion. */
  modelVersion?(dir: string): string | undefined;
  /** Most images one merged batch of compatible requests may hold. */
  maxMergedImages?: number;
  /**
   * A worker whose batch goes this long without progress (a denoising step, a model loaded) is killed,
   * failing the batch: a deadlock in native code would otherwise hold its requests forever. 0 = never.
   */
  stallTimeoutMs?: number;
  /**
   * The same for a worker that is starting: it is killed once it goes this long without loading a model
   * or becoming ready. Default: stallTimeoutMs, but at least START_STALL_MIN_MS (booting Node and
   * onnxruntime is no progress it reports); 0 with a stallTimeoutMs of 0.
   */
  startStallTimeoutMs?: number;
  /** How long close() lets a worker finish stopping (e.g. a model load) before killing it; default WORKER_STOP_GRACE_MS. */
  stopGraceMs?: number;
  /** Where the models' measured memory is kept across workers and restarts. */
  memoryFigures?: MemoryFigureBook;
  /** The clock of the restart backoff; real time unless a test passes its own. */
  clock?: PoolClock;
  /**
   * The worker module to run: by default the one next to the pool's own modules, in their language
   * (the sources under vitest, which each worker then compiles again under tsx); tests pass the built one.
   */
  workerScript?: string;
  logger?: Logger;
  metrics?: EngineMetrics;
}

/** The pool's view of the measured memory figures (see src/models/memory-figures.ts). */
export interface MemoryFigureBook {
  all(): Record<string, ModelMemory>;
  /** The figures kept of one model folder, if any. */
  of(modelDir: string): ModelMemory | undefined;
  /** Keeps the figures a worker reported with those known, and returns what it keeps. */
  record(modelDir: string, memory: ModelMemory): ModelMemory;
}

/** What the engine reports for monitoring; models are named by their folder. */
export interface EngineMetrics extends SlotMetrics {
  queueWait(seconds: number): void;
  batchFinished(batch: { model: string; images: number; steps: number; seconds: number; outcome: BatchOutcome }): void;
  /** A batch's event stream sent a preview (a streamed partial image). */
  partialImage(model: string): void;
  /** A batch waited for memory another worker's batch had planned on (see memory-arbiter.ts). */
  memoryWaited(): void;
}

export type BatchOutcome = 'completed' | 'cancelled' | 'failed' | 'worker_died';

/**
 * The pool of worker processes. Its users declare what they use of it (service/images.ts ImageEngine,
 * http/health.ts HealthEngine), which it satisfies.
 */
export interface WorkerPool {
  /**
   * `ticket`: the request the batch belongs to (see ticket()); without one the batch is a request of its
   * own. `onEvent` hears the batch's progress and previews, its items numbered as in `batch`.
   */
  generate(batch: GenerationBatch, signal?: AbortSignal, ticket?: Ticket, onEvent?: (event: BatchEvent) => void): Promise<GeneratedImage[]>;
  close(): Promise<void>;
  /**
   * A request's claim on the queue: its batches share it (see Ticket), weighed by their estimated cost.
   * `client`: who sent the request (e.g. its API key's label), for fairness; ANONYMOUS_CLIENT when none.
   */
  ticket(batches: readonly GenerationBatch[], client?: string, limits?: ClientLimits): Ticket;
  /** Jobs running and waiting. */
  load(): { running: number; queued: number };
  /** See JobQueue.wouldRefuse. */
  wouldRefuse(client?: string, limits?: ClientLimits): QueueFullError | QueueClosedError | undefined;
  /** See JobQueue.waitOutside. */
  waitOutside(ticket: Ticket): () => void;
  /** Whether the workers are ready, and the models they preload. */
  readiness(): Readiness;
  /** Each model that live workers hold now, by name, and on how many (for /metrics). */
  modelsHeld(): Record<string, number>;
  /** The worker processes now in the slots (a dead one stays listed until its replacement starts); `step`: see WorkerProcess. */
  workers(): { pid?: number; alive: boolean; ready: boolean; busy: boolean; step: number }[];
}

/**
 * The kernel's OOM killer ended the worker running a batch, which its memory plan had let run: the
 * batch needed more than the `plannedBytes` it was granted. The pool has recorded that (see
 * ModelMemory.exceeded), so the plan refuses the same request up front from now on.
 */
export class WorkerOutOfMemoryError extends Error {
  constructor(
    readonly model: string,
    readonly size: string,
    readonly plannedBytes: number,
  ) {
    super(`the worker making ${size} images with model '${model}' was killed by the system for running out of memory`);
    this.name = 'WorkerOutOfMemoryError';
  }
}

/** The least a starting worker gets between signs of progress (see EnginePoolOptions.startStallTimeoutMs). */
const START_STALL_MIN_MS = 300_000;

/** How long close() lets a worker finish stopping by default: part of what a shutdown takes beyond SHUTDOWN_TIMEOUT_SECONDS (deploy/ sizes stop grace periods by it). */
export const WORKER_STOP_GRACE_MS = 5000;

/** Each worker's share of the cores, at least one: what the workers' threads take together is then the cores. */
export const sharedThreads = (workers: number): number => Math.max(1, Math.floor(os.availableParallelism() / workers));

export function createEnginePool(options: EnginePoolOptions): WorkerPool {
  const { logger, metrics } = options;
  const preload = options.preload ?? [];
  const cudaDevices = options.cudaDevices ?? [0];
  const engine: WorkerInit['engine'] = {
    runtime: {
      provider: options.executionProvider,
      threads: options.threadsPerWorker ?? sharedThreads(options.workers),
      spinning: options.threadSpinning ?? false,
      graphRewrites: options.graphRewrites,
    },
    // Every worker holds its own copy of the models it uses, so the budget is shared out among them.
    modelMemoryBudget: Math.floor((options.modelMemoryBudget ?? os.totalmem() * MODEL_BUDGET_SHARE) / options.workers),
    vaeTiling: options.vaeTiling,
  };
  const memory = new MemoryArbiter({ plannable: () => plannableBytes(), resident: residentBytesOf }, (options.memoryLimit ?? Infinity) * HEADROOM);
  const queue = new JobQueue(0, options.queueMax, {
    maxWaitMs: options.queueTimeoutMs,
    maxQueuedSeconds: options.queueMaxSeconds,
    onWaited: (ms) => metrics?.queueWait(ms / 1000),
  });
  const costs = new CostModel();

  /** The version of a model's folder that the model scan last found; `named` where it found none (a model removed). */
  const versionNow = (dir: string, named: string | undefined): string | undefined => options.modelVersion?.(dir) ?? named;

  /**
   * The models a worker starting now preloads, each at the version the model scan last found: one
   * replaced since the server started (`models import --force`) is loaded as the files it holds now. At
   * the version of the server's start, a worker started after the replacement (a crashed one's) loaded
   * the new files as the old version: it loaded them again at the model's first request, calibrated them
   * twice, and the figures of the first calibration, labelled with the old version, replaced the model's
   * (DATA_DIR, `models list`: not measured), an OOM kill's lesson with them.
   */
  const preloadNow = (): ModelRef[] => preload.map(({ dir, version }) => ({ dir, version: versionNow(dir, version) }));

  const stallMs = options.stallTimeoutMs ?? 0;
  const slots = new WorkerSlots({
    slots: options.workers,
    init: (slot) => ({
      type: 'init',
      engine: { ...engine, runtime: { ...engine.runtime, deviceId: cudaDeviceOf(slot, cudaDevices) }, knownMemory: options.memoryFigures?.all() ?? {} },
      preload: preloadNow(),
      nice: options.workerNice ?? 0,
    }),
    preload,
    modelVersion: options.modelVersion,
    spawn: { script: options.workerScript, mallocHugePages: options.mallocHugePages },
    startStallMs: options.startStallTimeoutMs ?? (stallMs > 0 ? Math.max(stallMs, START_STALL_MIN_MS) : 0),
    clock: options.clock ?? REAL_CLOCK,
    logger,
    metrics,
    onMessage: handlePoolMessage,
    onChange: () => queue.setConcurrency(slots.ready().length),
    onExit: (worker) => memory.release(worker),
    waitingForMemory: (worker) => memory.isWaiting(worker),
  });

  /** A worker's messages about memory: its model's measured figures, and its batches' plans (see memory-arbiter.ts). */
  function handlePoolMessage(worker: WorkerProcess, slot: number, message: PoolMessage): void {
    switch (message.type) {
      case 'model-memory':
        // Kept as the most seen: one worker's own load grew it by a fraction of that where the model loaded
        // second or in a replacement (/metrics shows the kept figures: see Metrics).
        recordMemory(message.modelDir, message.memory);
        return;
      case 'memory-ask':
        return memory.ask(worker, message.exclusive);
      case 'memory-take':
        return memory.take(worker, message.bytes);
      case 'memory-release':
        return memory.release(worker);
      case 'memory-wait':
        if (memory.wait(worker)) {
          metrics?.memoryWaited();
          const who = memory.isExclusive(worker) ? "a model's calibration" : 'batch';
          logger?.info({ worker: slot, plannedBytes: memory.plannedBytes() }, `${who} waits for memory other batches planned on`);
        }
    }
  }

  /**
   * Keeps a model's figures in the book and, when that changed what it keeps, sends them to every worker,
   * which plans from them with its own (MemoryPlan.adopt); answers what the book keeps. Given them only
   * as it started, each worker planned from its own runs: two planned the same request 730 and 795 MiB,
   * one without a figure of its own at a large size scaled a small one up by the square, and an OOM
   * kill's lesson (outOfMemory) reached the dead worker's replacement but not the others, which could
   * run the same request into the OOM killer again.
   */
  function recordMemory(modelDir: string, reported: ModelMemory): ModelMemory {
    const book = options.memoryFigures;
    if (!book) return reported;
    const before = book.of(modelDir);
    const kept = book.record(modelDir, reported);
    if (!isDeepStrictEqual(before, kept)) for (const worker of slots.all()) worker.shareMemory(modelDir, kept);
    return kept;
  }

  /**
   * The idle worker to run a batch of `modelDir` on: one holding that model, else the one holding the
   * fewest. The first idle one served every batch alike: two workers serving two models took turns
   * loading both (a real model's load takes seconds; under MODEL_MEMORY_BUDGET each load evicted the other).
   */
  function workerFor(modelDir: string): WorkerProcess | undefined {
    const idle = slots.idle();
    return idle.find((w) => w.loaded.has(modelDir)) ?? idle.reduce<WorkerProcess | undefined>((best, w) => (best && best.loaded.size <= w.loaded.size ? best : w), undefined);
  }

  /**
   * Runs a task on `worker` (a batch, or a model's load or release: see model-upkeep.ts) watched by a
   * stall watchdog, which `task` is handed the progress of: a deadlock in native code would otherwise
   * hold the worker, and whatever waits for it, for good. What the task planned on with the memory
   * arbiter is released once it ends, however it ends.
   */
  async function onWorker<T>(worker: WorkerProcess, task: (progress: () => void) => Promise<T>): Promise<T> {
    const watchdog = stallWatchdog(worker, stallMs, () => memory.isWaiting(worker));
    try {
      return await task(watchdog.progress);
    } finally {
      memory.release(worker);
      watchdog.stop();
    }
  }

  /**
   * The batch at the version of its model's folder that the model scan last found. One that waited while
   * the model was replaced (`models import --force`) loads the files there now whatever version it names:
   * named as the old one, a worker switching between it and the requests sent since loaded the same files
   * again at every switch, and planned them with (and filed their figures under) the old files' figures.
   * A model removed meanwhile has no version: its batch fails as removed, or runs on the sessions held.
   */
  function atCurrentVersion(batch: GenerationBatch): GenerationBatch {
    const version = versionNow(batch.modelDir, batch.modelVersion);
    return version === batch.modelVersion ? batch : { ...batch, modelVersion: version };
  }

  async function runOnWorker(queued: GenerationBatch, stop: AbortSignal, onEvent: (event: BatchEvent) => boolean, left: LeftItems): Promise<(GeneratedImage | undefined)[]> {
    const batch = atCurrentVersion(queued);
    // The queue runs no more jobs than there are ready workers, and each job holds its worker until it ends.
    const worker = workerFor(batch.modelDir);
    if (!worker) throw new Error('internal error: the job queue started a job with no idle worker');
    const started = performance.now();
    const warm = worker.loaded.has(batch.modelDir);
    let outcome: BatchOutcome | 'not_started' = 'failed';
    /** Why the worker never began the batch, when it did not (WorkerDiedError.reason): the batch then waits for another. */
    let notBegun = '';
    let images = 0;
    const oomKillsBefore = cgroupOomKills();
    try {
      // A batch whose clients left in part ran faster than it would have whole (WorkerRuntime.runMerged): it does not time its model.
      const timesModel = () => warm && left.size === 0;
      const onBatchEvent = (event: BatchEvent) => {
        // The worker's own time (see WorkerProcess.seconds), not ours: under a flood our event loop hears the
        // steps seconds late, and a model timed so would look a hundred times slower than it is.
        if (event.type === 'step' && timesModel()) costs.progress(batch, worker.seconds, event.step / event.total);
        // Only the previews sent: those of a client that left a merged batch others stay in go to nobody.
        if (onEvent(event) && event.type === 'preview') metrics?.partialImage(modelName(batch.modelDir));
      };
      const result = await onWorker(worker, (progress) => worker.run(batch, stop, progress, onBatchEvent, left));
      outcome = 'completed';
      images = result.filter((image) => image !== undefined).length;
      if (timesModel()) costs.record(batch, worker.seconds);
      return result;
    } catch (err) {
      // Sent to a worker already dead (its exit not yet seen), or one hung as it came (the stall watchdog
      // kills it, its 'started' never heard): the batch never ran, and waits for another.
      if (err instanceof WorkerDiedError && !err.batchStarted) {
        outcome = 'not_started';
        notBegun = err.reason;
        throw new RequeueError(err);
      }
      if (err instanceof WorkerDiedError) outcome = 'worker_died';
      else if (stop.aborted) outcome = 'cancelled';
      // Killed by the system (not the pool's watchdog or shutdown) while its group's OOM kills went up.
      const killedForMemory = err instanceof WorkerDiedError && err.killedBySystem && !stop.aborted && (cgroupOomKills() ?? 0) > (oomKillsBefore ?? Infinity);
      throw killedForMemory && worker.grant && worker.plannedSamples ? outOfMemory(batch, worker.grant.budget, worker.plannedSamples) : err;
    } finally {
      if (outcome === 'not_started') logger?.warn({ model: modelName(batch.modelDir), workerPid: worker.pid }, `batch handed to a worker process that ${notBegun} before it began it; it waits for another worker`);
      else report(batch, worker, outcome, images, started);
    }
  }

  /**
   * Records that each sample of the batch's model calls needed more than its share of what it was
   * planned with (its model's `exceeded` figures, kept for this server's lifetime), for the next plans.
   */
  function outOfMemory(batch: GenerationBatch, plannedBytes: number, samplesPerRun: number): WorkerOutOfMemoryError {
    recordMemory(batch.modelDir, exceededFigures(batch.width * batch.height, plannedBytes, samplesPerRun));
    logger?.error({ model: modelName(batch.modelDir), size: `${batch.width}x${batch.height}`, images: batch.items.length, plannedBytes }, 'the OOM killer ended a worker: its batch needed more memory than planned');
    return new WorkerOutOfMemoryError(modelName(batch.modelDir), `${batch.width}x${batch.height}`, plannedBytes);
  }

  function report(batch: GenerationBatch, worker: WorkerProcess, outcome: BatchOutcome, images: number, started: number): void {
    // Less the model's load (and its calibration runs), which imagegen_model_load_duration_seconds has: counted
    // here too, a batch after each eviction seemed as slow as a load, and steps per second fell with it.
    const seconds = Math.max(0, (performance.now() - started) / 1000 - worker.loadSeconds);
    const steps = worker.step;
    metrics?.batchFinished({ model: modelName(batch.modelDir), images, steps, seconds, outcome });
    logger?.debug({ model: modelName(batch.modelDir), size: `${batch.width}x${batch.height}`, items: batch.items.length, steps, runMs: Math.round(seconds * 1000), outcome }, 'batch finished');
  }

  const stopUpkeep = startModelUpkeep({ slots, queue, guard: onWorker, modelVersion: options.modelVersion, logger });

  const estimate = (batch: GenerationBatch) => costs.estimate(batch);
  const merger = new BatchMerger(queue, runOnWorker, options.maxMergedImages ?? 16, estimate);

  return {
    generate: (batch, signal, ticket, onEvent) => merger.generate(batch, signal, ticket, onEvent),
    ticket: (batches, client, limits) => new Ticket(client, batches.reduce((sum, batch) => sum + estimate(batch), 0), limits),
    load: () => queue.load(),
    wouldRefuse: (client, limits) => queue.wouldRefuse(client, limits),
    waitOutside: (ticket) => queue.waitOutside(ticket),
    readiness: () => slots.readiness(),
    modelsHeld: () => slots.modelsHeld(),
    workers: () => slots.all().map((w) => ({ pid: w.pid, alive: w.alive, ready: w.ready, busy: w.busy, step: w.step })),
    async close() {
      stopUpkeep();
      queue.close();
      await slots.close(options.stopGraceMs ?? WORKER_STOP_GRACE_MS);
    },
  };
}
