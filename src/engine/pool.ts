import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Logger } from 'pino';
import type { EngineSettings } from '../pipelines/run.js';
import { exceededFigures, type ModelMemory } from '../models/memory-figures.js';
import { BatchMerger } from './batcher.js';
import { CostModel } from './cost-model.js';
import { MemoryArbiter } from './memory-arbiter.js';
import { cgroupOomKills } from '../runtime/cgroup-memory.js';
import { HEADROOM, plannableBytes, residentBytesOf } from '../runtime/memory.js';
import { JobQueue, RequeueError, Ticket, type ClientLimits, type QueueClosedError, type QueueFullError } from './job-queue.js';
import type { ExecutionProvider } from '../runtime/providers.js';
import type { BatchEvent, GeneratedImage, GenerationBatch, ModelRef } from '../runtime/types.js';
import { WorkerDiedError, WorkerProcess, type WorkerListener } from './worker-process.js';

/**
 * The engine as a pool of worker processes, each keeping its pipelines loaded between jobs. Jobs wait
 * in a bounded queue (see job-queue.ts) that lets as many jobs run as there are workers ready: a
 * worker is ready once it has loaded the models to preload, so requests wait (bounded by the queue's
 * timeout) instead of failing while models load or while a dead worker's replacement starts.
 * The queue weighs each batch by its estimated seconds (cost-model.ts, learned from the batches that
 * finished here) to keep clients fair to each other and to answer 429 with a Retry-After that reflects
 * the work ahead.
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
  /** How far below the server's the workers' CPU priority is (see WorkerInit.nice); default 0. */
  workerNice?: number;
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
  /** How long close() lets a worker finish stopping (e.g. a model load) before killing it; default 5 s. */
  stopGraceMs?: number;
  /** Where the models' measured memory is kept across workers and restarts. */
  memoryFigures?: MemoryFigureBook;
  /** The clock of the restart backoff; real time unless a test passes its own. */
  clock?: PoolClock;
  logger?: Logger;
  metrics?: EngineMetrics;
}

/** The pool's view of the measured memory figures (see src/models/memory-figures.ts). */
export interface MemoryFigureBook {
  all(): Record<string, ModelMemory>;
  record(modelDir: string, memory: ModelMemory): void;
}

/** Time as the restart backoff sees it: `after` schedules `fn` in `ms` and returns its cancel. */
export interface PoolClock {
  now(): number;
  after(ms: number, fn: () => void): () => void;
}

const REAL_CLOCK: PoolClock = {
  now: () => performance.now(),
  after(ms, fn) {
    const timer = setTimeout(fn, ms);
    return () => clearTimeout(timer);
  },
};

/** What the engine reports for monitoring; models are named by their folder. */
export interface EngineMetrics {
  queueWait(seconds: number): void;
  batchFinished(batch: { model: string; images: number; steps: number; seconds: number; outcome: BatchOutcome }): void;
  /** A batch's event stream sent a preview (a streamed partial image). */
  partialImage(model: string): void;
  modelLoaded(model: string, seconds: number): void;
  modelMemory(model: string, memory: ModelMemory): void;
  /** A batch waited for memory another worker's batch had planned on (see memory-arbiter.ts). */
  memoryWaited(): void;
  workerReplaced(): void;
}

export type BatchOutcome = 'completed' | 'cancelled' | 'failed' | 'worker_died';

export interface Readiness {
  /**
   * Every worker is up and has loaded every model to preload; or, once that was so (`started`), at least
   * one worker has: a server whose other workers crash and restart still serves, at less speed.
   */
  ready: boolean;
  /** The pool has been ready with all its workers once: it is past starting. */
  started: boolean;
  workers: { total: number; ready: number };
  /** The models to preload: on how many workers each has loaded (it may since have been evicted, and loads again on use), and why its last load failed. */
  models: { model: string; loadedOn: number; error?: string }[];
  /** How the last worker to end before it was ready ended, while none has become ready since: why a server stays "starting". */
  startFailure?: string;
}

/** What the service and the HTTP layer use of the engine. */
export interface EnginePool {
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
  /** Jobs running and waiting, for /health. */
  load(): { running: number; queued: number };
  /** See JobQueue.wouldRefuse. */
  wouldRefuse(client?: string, limits?: ClientLimits): QueueFullError | QueueClosedError | undefined;
  /** For /ready. */
  readiness(): Readiness;
  /** Each model that live workers hold now, by name, and on how many (for /metrics). */
  modelsHeld(): Record<string, number>;
}

/** The pool of worker processes. */
export interface WorkerPool extends EnginePool {
  /** The worker processes now in the slots (a dead one stays listed until its replacement starts); `step`: see WorkerProcess. */
  workers(): { pid?: number; alive: boolean; ready: boolean; busy: boolean; step: number }[];
}

const modelName = (modelDir: string) => path.basename(modelDir);

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

/**
 * A dead worker that had proved itself (completed a batch, or stayed up STABLE_MS) is restarted at once;
 * one that had not waits, twice as long with each such death in a row. A broken install or GPU, or
 * models too big for memory (a worker killed right after loading them), would otherwise make the pool
 * spin, reloading models as fast as it can.
 */
const RESTART_BACKOFF_MS = { first: 1000, max: 30_000 };
/** The least a starting worker gets between signs of progress (see EnginePoolOptions.startStallTimeoutMs). */
const START_STALL_MIN_MS = 300_000;
const STABLE_MS = 60_000;

/** Each worker's share of the cores, at least one: what the workers' threads take together is then the cores. */
export const sharedThreads = (workers: number): number => Math.max(1, Math.floor(os.availableParallelism() / workers));

export function createEnginePool(options: EnginePoolOptions): WorkerPool {
  const { logger, metrics } = options;
  const clock = options.clock ?? REAL_CLOCK;
  const preload = options.preload ?? [];
  const cudaDevices = options.cudaDevices ?? [0];
  const engine: Partial<EngineSettings> = {
    runtime: {
      provider: options.executionProvider,
      threads: options.threadsPerWorker ?? sharedThreads(options.workers),
      spinning: options.threadSpinning ?? false,
    },
    // Every worker holds its own copy of the models it uses, so the budget is shared out among them.
    modelMemoryBudget: Math.floor((options.modelMemoryBudget ?? os.totalmem() * 0.6) / options.workers),
    vaeTiling: options.vaeTiling,
  };
  const memory = new MemoryArbiter({ plannable: () => plannableBytes(), resident: residentBytesOf }, (options.memoryLimit ?? Infinity) * HEADROOM);
  const queue = new JobQueue(0, options.queueMax, {
    maxWaitMs: options.queueTimeoutMs,
    maxQueuedSeconds: options.queueMaxSeconds,
    onWaited: (ms) => metrics?.queueWait(ms / 1000),
  });
  const costs = new CostModel();

  /** One worker per slot (none while a failed start waits for its retry); a slot's CUDA device stays the same across restarts. */
  const slots: (WorkerProcess | undefined)[] = Array(options.workers).fill(undefined);
  const workers = () => slots.filter((w): w is WorkerProcess => w !== undefined);
  /** Deaths of unproven workers in a row, per slot (for the restart backoff). */
  const failedStarts: number[] = Array(options.workers).fill(0);
  /** Cancels of the restarts waiting for their delay. */
  const restarts = new Set<() => void>();
  /** When each worker became ready, on the pool's clock. */
  const readyAt = new Map<WorkerProcess, number>();
  const proven = (worker: WorkerProcess) => worker.batchesDone > 0 || clock.now() - (readyAt.get(worker) ?? Infinity) >= STABLE_MS;
  const readyWorkers = () => workers().filter((w) => w.ready);
  const loadErrors = new Map<string, string>();
  let startFailure: string | undefined;
  /**
   * The watchdogs of workers not yet ready: one that neither loads a model nor says anything for the
   * stall timeout is hung (a deadlock in native code while loading) and would hold the server "starting" for good.
   */
  const starting = new Map<WorkerProcess, { progress(): void; stop(): void }>();
  const stallMs = options.stallTimeoutMs ?? 0;
  const startStallMs = options.startStallTimeoutMs ?? (stallMs > 0 ? Math.max(stallMs, START_STALL_MIN_MS) : 0);
  /** See Readiness.started. */
  let started = false;
  let closing = false;

  const listener: WorkerListener = {
    event(worker, message) {
      const slot = slots.indexOf(worker);
      starting.get(worker)?.progress();
      switch (message.type) {
        case 'ready':
          starting.get(worker)?.stop();
          starting.delete(worker);
          startFailure = undefined;
          readyAt.set(worker, clock.now());
          logger?.info({ worker: slot, pid: worker.pid }, 'worker ready');
          break;
        case 'model-loaded':
          loadErrors.delete(message.modelDir);
          metrics?.modelLoaded(modelName(message.modelDir), message.seconds);
          logger?.info({ worker: slot, model: modelName(message.modelDir), loadMs: Math.round(message.seconds * 1000) }, 'model loaded');
          break;
        case 'model-memory':
          options.memoryFigures?.record(message.modelDir, message.memory);
          metrics?.modelMemory(modelName(message.modelDir), message.memory);
          break;
        case 'model-load-failed':
          loadErrors.set(message.modelDir, message.message);
          logger?.error({ worker: slot, model: modelName(message.modelDir), error: message.message }, 'model failed to load');
          break;
        case 'memory-ask':
          memory.ask(worker, message.exclusive);
          return;
        case 'memory-take':
          memory.take(worker, message.bytes);
          return;
        case 'memory-release':
          memory.release(worker);
          return;
        case 'memory-wait':
          if (memory.wait(worker)) {
            metrics?.memoryWaited();
            const who = memory.isExclusive(worker) ? "a model's calibration" : 'batch';
            logger?.info({ worker: slot, plannedBytes: memory.plannedBytes() }, `${who} waits for memory other batches planned on`);
          }
          return;
      }
      queue.setConcurrency(readyWorkers().length);
      // Past starting once every worker is ready with every preloaded model, whether anyone asked /ready then or not.
      started ||= preloadState().full;
    },
    exit(worker, reason, hadBatch) {
      starting.get(worker)?.stop();
      starting.delete(worker);
      memory.release(worker);
      queue.setConcurrency(readyWorkers().length);
      const wasProven = proven(worker);
      const wasReady = readyAt.delete(worker);
      if (closing) return;
      const slot = slots.indexOf(worker);
      restartLater(slot, wasProven, `worker process ${reason}${hadBatch ? '' : ' while idle'}`, worker.pid, hadBatch);
      if (!wasReady) startFailure = `a worker process ${reason} before it was ready (${failedStarts[slot]} time${failedStarts[slot] === 1 ? '' : 's'} in a row; the server log says more)`;
      else if (!wasProven) startFailure = `a worker process ${reason} soon after it was ready (the server log says more)`;
    },
  };

  function startWorker(slot: number): void {
    const deviceId = cudaDevices[slot % cudaDevices.length];
    try {
      const knownMemory = options.memoryFigures?.all() ?? {};
      const worker = new WorkerProcess({ type: 'init', engine: { ...engine, runtime: { ...engine.runtime!, deviceId }, knownMemory }, preload, nice: options.workerNice ?? 0 }, listener);
      slots[slot] = worker;
      starting.set(worker, stallWatchdog(worker, startStallMs, ' while starting (loading its models)'));
    } catch (err) {
      const reason = `worker process could not be started (${(err as Error).message})`;
      restartLater(slot, false, reason);
      startFailure = `a ${reason}`;
    }
  }

  function restartLater(slot: number, wasProven: boolean, reason: string, pid?: number, hadBatch = false): void {
    if (wasProven) failedStarts[slot] = 0;
    const delay = wasProven ? 0 : Math.min(RESTART_BACKOFF_MS.max, RESTART_BACKOFF_MS.first * 2 ** failedStarts[slot]++);
    logger?.error({ worker: slot, pid, reason, restartInMs: delay }, `${reason}; starting a replacement${hadBatch ? ' (the requests of its batch fail with 500)' : ''}`);
    metrics?.workerReplaced();
    const cancel = clock.after(delay, () => {
      restarts.delete(cancel);
      if (!closing) startWorker(slot);
    });
    restarts.add(cancel);
  }
  for (let slot = 0; slot < options.workers; slot++) startWorker(slot);

  /** Kills `worker` once it goes `limit` ms without progress(), not counting time it waits for memory; `doing` says what it was at, for the kill's reason. */
  function stallWatchdog(worker: WorkerProcess, limit = stallMs, doing = ''): { progress(): void; stop(): void } {
    let timer: NodeJS.Timeout | undefined;
    const progress = () => {
      clearTimeout(timer);
      if (limit > 0) timer = setTimeout(() => (memory.isWaiting(worker) ? progress() : worker.kill(`made no progress for ${limit / 1000} s${doing} and was killed`)), limit);
    };
    progress();
    return { progress, stop: () => clearTimeout(timer) };
  }

  async function runOnWorker(batch: GenerationBatch, stop: AbortSignal, onEvent: (event: BatchEvent) => void): Promise<GeneratedImage[]> {
    // The queue runs no more jobs than there are ready workers, and each job holds its worker until it ends.
    const worker = readyWorkers().find((w) => !w.busy);
    if (!worker) throw new Error('internal error: the job queue started a job with no idle worker');
    const started = performance.now();
    const warm = worker.loaded.has(batch.modelDir);
    let outcome: BatchOutcome | 'not_started' = 'failed';
    let images = 0;
    const watchdog = stallWatchdog(worker);
    const oomKillsBefore = cgroupOomKills();
    try {
      const heard = (event: BatchEvent) => {
        if (event.type === 'preview') metrics?.partialImage(modelName(batch.modelDir));
        if (event.type === 'step' && warm) costs.progress(batch, (performance.now() - started) / 1000, event.step / event.total);
        onEvent(event);
      };
      const result = await worker.run(batch, stop, watchdog.progress, heard);
      outcome = 'completed';
      images = result.length;
      if (warm) costs.record(batch, (performance.now() - started) / 1000);
      return result;
    } catch (err) {
      // Sent to a worker already dead (its exit not yet seen): the batch never ran, and waits for another.
      if (err instanceof WorkerDiedError && !err.batchStarted) {
        outcome = 'not_started';
        throw new RequeueError(err);
      }
      if (err instanceof WorkerDiedError) outcome = 'worker_died';
      else if (stop.aborted) outcome = 'cancelled';
      // Killed by the system (not the pool's watchdog or shutdown) while its group's OOM kills went up.
      const killedForMemory = err instanceof WorkerDiedError && err.killedBySystem && !stop.aborted && (cgroupOomKills() ?? 0) > (oomKillsBefore ?? Infinity);
      throw killedForMemory && worker.grant && worker.plannedSamples ? outOfMemory(batch, worker.grant.budget, worker.plannedSamples) : err;
    } finally {
      memory.release(worker);
      watchdog.stop();
      if (outcome === 'not_started') logger?.warn({ model: modelName(batch.modelDir), pid: worker.pid }, 'batch sent to a worker that had died; it waits for another');
      else report(batch, worker, outcome, images, started);
    }
  }

  /**
   * Records that each sample of the batch's model calls needed more than its share of what it was
   * planned with (its model's `exceeded` figures, kept for this server's lifetime), for the next plans.
   */
  function outOfMemory(batch: GenerationBatch, plannedBytes: number, samplesPerRun: number): WorkerOutOfMemoryError {
    options.memoryFigures?.record(batch.modelDir, exceededFigures(batch.width * batch.height, plannedBytes, samplesPerRun));
    logger?.error({ model: modelName(batch.modelDir), size: `${batch.width}x${batch.height}`, images: batch.items.length, plannedBytes }, 'the OOM killer ended a worker: its batch needed more memory than planned');
    return new WorkerOutOfMemoryError(modelName(batch.modelDir), `${batch.width}x${batch.height}`, plannedBytes);
  }

  function report(batch: GenerationBatch, worker: WorkerProcess, outcome: BatchOutcome, images: number, started: number): void {
    const seconds = (performance.now() - started) / 1000;
    const steps = worker.step;
    metrics?.batchFinished({ model: modelName(batch.modelDir), images, steps, seconds, outcome });
    logger?.debug({ model: modelName(batch.modelDir), size: `${batch.width}x${batch.height}`, items: batch.items.length, steps, runMs: Math.round(seconds * 1000), outcome }, 'batch finished');
  }

  /** The workers ready, each preloaded model and on how many live workers it loaded, and whether that is all of them. */
  function preloadState() {
    const live = workers().filter((w) => w.alive);
    const ready = readyWorkers().length;
    // A preloaded model whose folder was removed since cannot hold readiness back: the other models
    // are served (a worker started since could not load it, and never will).
    const models = preload.filter(({ dir }) => existsSync(dir)).map(({ dir }) => ({
      model: modelName(dir),
      loadedOn: live.filter((w) => w.loadedOnce.has(dir)).length,
      ...(loadErrors.has(dir) && { error: loadErrors.get(dir) }),
    }));
    return { ready, models, full: ready === options.workers && models.every((m) => m.loadedOn === options.workers) };
  }

  const estimate = (batch: GenerationBatch) => costs.estimate(batch);
  const merger = new BatchMerger((job, signal, jobOptions) => queue.run(job, signal, jobOptions), runOnWorker, options.maxMergedImages ?? 16, estimate);

  return {
    generate: (batch, signal, ticket, onEvent) => merger.generate(batch, signal, ticket, onEvent),
    ticket: (batches, client, limits) => new Ticket(client, batches.reduce((sum, batch) => sum + estimate(batch), 0), limits),
    load: () => queue.load(),
    wouldRefuse: (client, limits) => queue.wouldRefuse(client, limits),
    readiness() {
      const { ready, models, full } = preloadState();
      return {
        ready: full || (started && ready > 0 && models.every((m) => m.loadedOn > 0)),
        started,
        workers: { total: options.workers, ready },
        models,
        ...(startFailure !== undefined && { startFailure }),
      };
    },
    modelsHeld() {
      const held: Record<string, number> = {};
      for (const w of workers()) if (w.alive) for (const dir of w.loaded) held[modelName(dir)] = (held[modelName(dir)] ?? 0) + 1;
      return held;
    },
    workers: () => workers().map((w) => ({ pid: w.pid, alive: w.alive, ready: w.ready, busy: w.busy, step: w.step })),
    async close() {
      closing = true;
      for (const cancel of restarts) cancel();
      queue.close();
      await Promise.all(workers().map((w) => w.stop(options.stopGraceMs ?? 5000)));
    },
  };
}
