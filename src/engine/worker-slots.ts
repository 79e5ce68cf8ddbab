import { existsSync } from 'node:fs';
import type { Logger } from 'pino';
import type { ModelRef } from '../runtime/types.js';
import { stallWatchdog, type StallWatchdog } from './stall-watchdog.js';
import type { WorkerInit } from './worker-protocol.js';
import { modelName, WorkerProcess, type WorkerListener, type WorkerSpawn } from './worker-process.js';
import { plural } from '../util/plural.js';
import { messageOf } from '../util/error-message.js';

/**
 * The pool's worker processes, one per slot, and their lives: starting each, killing one that hangs
 * while it starts, replacing one that died (at once if it had proved itself, else after a backoff),
 * and what /ready says about them. Which batch runs where, and the memory they plan on, are the pool's
 * (pool.ts): the messages about those are handed to it.
 */

/** Time as the restart backoff sees it: `after` schedules `fn` in `ms` and returns its cancel. */
export interface PoolClock {
  now(): number;
  after(ms: number, fn: () => void): () => void;
}

export const REAL_CLOCK: PoolClock = {
  now: () => performance.now(),
  after(ms, fn) {
    const timer = setTimeout(fn, ms);
    return () => clearTimeout(timer);
  },
};

/** What the slots report for monitoring; models are named by their folder. */
export interface SlotMetrics {
  modelLoaded(model: string, seconds: number): void;
  workerReplaced(): void;
}

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

/** The messages of a worker that are the pool's: its model's measured memory and its batches' memory plans. */
export type PoolMessage = Extract<Parameters<WorkerListener['event']>[1], { type: 'model-memory' | `memory-${string}` }>;

export interface WorkerSlotsOptions {
  slots: number;
  /** What the worker of `slot` starts with (its CUDA device stays the slot's across restarts). */
  init(slot: number): WorkerInit;
  /** Model folders every worker loads before it takes jobs. */
  preload: readonly ModelRef[];
  /**
   * The version of the usable model in a folder as the model scan last found it (ModelEntry.version),
   * undefined while there is none: a preloaded model that failed to load is tried again once it changed
   * (see preloadsToRetry). Without it, such a model loads again only when a request names it.
   */
  modelVersion?(dir: string): string | undefined;
  /** How each worker process is started (its module, its environment). */
  spawn?: WorkerSpawn;
  /** A starting worker that goes this long without loading a model or becoming ready is killed; 0 = never. */
  startStallMs: number;
  clock: PoolClock;
  logger?: Logger;
  metrics?: SlotMetrics;
  /** A worker's message that is the pool's (see PoolMessage). */
  onMessage(worker: WorkerProcess, slot: number, message: PoolMessage): void;
  /** A worker became ready, loaded a model, said it ends or ended: how many are ready may have changed. */
  onChange(): void;
  /** A worker ended (whatever it had planned on ends with it). */
  onExit(worker: WorkerProcess): void;
  /** Whether `worker` waits for memory other batches planned on: time it waits is no stall. */
  waitingForMemory(worker: WorkerProcess): boolean;
}

/**
 * A dead worker that had proved itself (completed a batch, or stayed up STABLE_MS) is restarted at once;
 * one that had not waits, twice as long with each such death in a row. A broken install or GPU, or
 * models too big for memory (a worker killed right after loading them), would otherwise make the pool
 * spin, reloading models as fast as it can.
 */
const RESTART_BACKOFF_MS = { first: 1000, max: 30_000 };
const STABLE_MS = 60_000;

export class WorkerSlots {
  /** One worker per slot (none while a failed start waits for its retry). */
  private readonly slots: (WorkerProcess | undefined)[];
  /** Deaths of unproven workers in a row, per slot (for the restart backoff). */
  private readonly failedStarts: number[];
  /** Cancels of the restarts waiting for their delay. */
  private readonly restarts = new Set<() => void>();
  /** When each worker became ready, on the clock. */
  private readonly readyAt = new Map<WorkerProcess, number>();
  /** Why each model folder's last load failed, and its version (modelVersion) then. */
  private readonly loadErrors = new Map<string, { message: string; version?: string }>();
  /**
   * The watchdogs of workers not yet ready: one that neither loads a model nor says anything for the
   * stall timeout is hung (a deadlock in native code while loading) and would hold the server "starting" for good.
   */
  private readonly starting = new Map<WorkerProcess, StallWatchdog>();
  private startFailure: string | undefined;
  /** See Readiness.started. */
  private started = false;
  private closing = false;
  private readonly listener: WorkerListener;
  /**
   * Kills the live workers as the server's process exits before close() has stopped them (a second stop
   * signal, which exits at once; a fatal error). A worker ends by itself once it hears its channel close,
   * but one hung in native code (what the stall watchdog is for) never hears it: it stayed behind, an
   * orphan holding its models' memory (a GPU's too) until someone found and killed it.
   */
  private readonly killOnExit = () => {
    for (const worker of this.all()) if (worker.alive) worker.kill('was killed as the server exited');
  };

  constructor(private readonly options: WorkerSlotsOptions) {
    this.slots = Array(options.slots).fill(undefined);
    this.failedStarts = Array(options.slots).fill(0);
    this.listener = {
      event: (worker, message) => this.heard(worker, message),
      exit: (worker, reason, hadBatch, task) => this.ended(worker, reason, hadBatch, task),
      unready: () => this.options.onChange(),
      output: (worker, { level, message, ...fields }) => this.options.logger?.[level]({ worker: this.slots.indexOf(worker), workerPid: worker.pid, ...fields }, message),
    };
    for (let slot = 0; slot < options.slots; slot++) this.start(slot);
    process.on('exit', this.killOnExit);
  }

  /** The worker processes now in the slots (a dead one stays until its replacement starts). */
  all(): WorkerProcess[] {
    return this.slots.filter((w): w is WorkerProcess => w !== undefined);
  }

  ready(): WorkerProcess[] {
    return this.all().filter((w) => w.ready);
  }

  /** The ready workers running no task: those a job may take. */
  idle(): WorkerProcess[] {
    return this.ready().filter((w) => !w.busy);
  }

  readiness(): Readiness {
    const { ready, models, full } = this.preloadState();
    return {
      ready: full || (this.started && ready > 0 && models.every((m) => m.loadedOn > 0)),
      started: this.started,
      workers: { total: this.options.slots, ready },
      models,
      ...(this.startFailure !== undefined && { startFailure: this.startFailure }),
    };
  }

  /** Each model that live workers hold now, by name, and on how many. */
  modelsHeld(): Record<string, number> {
    const held: Record<string, number> = {};
    for (const w of this.all()) if (w.alive) for (const dir of w.loaded) held[modelName(dir)] = (held[modelName(dir)] ?? 0) + 1;
    return held;
  }

  /** Stops every worker, letting each finish stopping for `graceMs`, and starts no more. */
  async close(graceMs: number): Promise<void> {
    this.closing = true;
    for (const cancel of this.restarts) cancel();
    await Promise.all(this.all().map((w) => w.stop(graceMs)));
    // Only once they stopped: an exit while they stop (a second stop signal) still kills them.
    process.off('exit', this.killOnExit);
  }

  private heard(worker: WorkerProcess, message: Parameters<WorkerListener['event']>[1]): void {
    const { logger, metrics } = this.options;
    const slot = this.slots.indexOf(worker);
    this.starting.get(worker)?.progress();
    switch (message.type) {
      case 'ready':
        this.starting.get(worker)?.stop();
        this.starting.delete(worker);
        this.startFailure = undefined;
        this.readyAt.set(worker, this.options.clock.now());
        logger?.info({ worker: slot, workerPid: worker.pid }, 'worker ready');
        break;
      case 'model-loaded':
        this.loadErrors.delete(message.modelDir);
        metrics?.modelLoaded(modelName(message.modelDir), message.seconds);
        logger?.info({ worker: slot, model: modelName(message.modelDir), loadMs: Math.round(message.seconds * 1000) }, 'model loaded');
        break;
      case 'model-load-failed': {
        const failed = { message: message.message, version: this.options.modelVersion?.(message.modelDir) };
        const known = this.loadErrors.get(message.modelDir);
        this.loadErrors.set(message.modelDir, failed);
        // Each request for the model tries its load again (its folder may have been repaired), and each
        // worker does: the same failure of the same folder is said once, not once per request.
        if (known?.message !== failed.message || known.version !== failed.version) {
          logger?.error({ worker: slot, model: modelName(message.modelDir), error: message.message }, 'model failed to load');
        }
        break;
      }
      case 'warning':
        logger?.warn({ worker: slot, workerPid: worker.pid }, message.message);
        return;
      default:
        this.options.onMessage(worker, slot, message);
        if (message.type !== 'model-memory') return;
    }
    this.changed();
  }

  /** `task`: see WorkerListener.exit. */
  private ended(worker: WorkerProcess, reason: string, hadBatch: boolean, task?: string): void {
    this.starting.get(worker)?.stop();
    this.starting.delete(worker);
    this.options.onExit(worker);
    this.options.onChange();
    const wasProven = this.proven(worker);
    const wasReady = this.readyAt.delete(worker);
    const slot = this.slots.indexOf(worker);
    if (this.closing) {
      // Stopping as asked needs no word; one killed for not stopping in time (close's grace) held the shutdown up, and may have been hung.
      if (worker.killed) this.options.logger?.warn({ worker: slot, workerPid: worker.pid }, `worker process ${reason}`);
      return;
    }
    // A batch's death says so below, and one that ended itself said why; else what it was doing, if anything.
    const doing = task ? ` ${task}` : hadBatch || worker.endedItself ? '' : ' while idle';
    this.restartLater(slot, wasProven, `worker process ${reason}${doing}`, worker.pid, hadBatch);
    const times = this.failedStarts[slot];
    if (!wasReady) this.startFailure = `a worker process ${reason} before it was ready (${plural(times, 'time')} in a row; the server log says more)`;
    else if (!wasProven) this.startFailure = `a worker process ${reason} soon after it was ready (the server log says more)`;
  }

  /** After a message that may change readiness: past starting once every worker is ready with every preloaded model, whether anyone asked /ready then or not. */
  private changed(): void {
    this.options.onChange();
    this.started ||= this.preloadState().full;
  }

  private proven(worker: WorkerProcess): boolean {
    return worker.batchesDone > 0 || this.options.clock.now() - (this.readyAt.get(worker) ?? Infinity) >= STABLE_MS;
  }

  private start(slot: number): void {
    try {
      const worker = new WorkerProcess(this.options.init(slot), this.listener, this.options.spawn);
      this.slots[slot] = worker;
      this.starting.set(worker, stallWatchdog(worker, this.options.startStallMs, () => this.options.waitingForMemory(worker), ' while starting (loading its models)'));
    } catch (err) {
      const reason = `worker process could not be started (${messageOf(err)})`;
      this.restartLater(slot, false, reason);
      this.startFailure = `a ${reason}`;
    }
  }

  private restartLater(slot: number, wasProven: boolean, reason: string, pid?: number, hadBatch = false): void {
    if (wasProven) this.failedStarts[slot] = 0;
    const delay = wasProven ? 0 : Math.min(RESTART_BACKOFF_MS.max, RESTART_BACKOFF_MS.first * 2 ** this.failedStarts[slot]++);
    this.options.logger?.error({ worker: slot, workerPid: pid, reason, restartInMs: delay }, `${reason}; starting a replacement${hadBatch ? ' (the requests of its batch fail with 500)' : ''}`);
    this.options.metrics?.workerReplaced();
    const cancel = this.options.clock.after(delay, () => {
      this.restarts.delete(cancel);
      if (!this.closing) this.start(slot);
    });
    this.restarts.add(cancel);
  }

  /**
   * The preloaded models a ready worker lacks, to be loaded on it now (their version as it is now): one
   * whose last load failed, once its folder changed since (repaired, or back after it was removed);
   * or, where none failed since, that another worker loaded since this one failed to. Without this, a
   * preload that failed would hold /ready at 503 until a request named the model, which a load
   * balancer that waits for /ready never sends.
   */
  preloadsToRetry(): ModelRef[] {
    const versionOf = this.options.modelVersion;
    if (!versionOf) return [];
    return this.options.preload.flatMap(({ dir }) => {
      const version = versionOf(dir);
      const failed = this.loadErrors.get(dir);
      const lacking = this.ready().some((w) => !w.loadedOnce.has(dir));
      const retry = version !== undefined && lacking && (!failed || failed.version !== version);
      return retry ? [{ dir, version }] : [];
    });
  }

  /** The workers ready, each preloaded model and on how many live workers it loaded, and whether that is all of them. */
  private preloadState() {
    const live = this.all().filter((w) => w.alive);
    const ready = this.ready().length;
    // A preloaded model whose folder was removed since cannot hold readiness back: the other models
    // are served (a worker started since could not load it, and never will).
    const models = this.options.preload
      .filter(({ dir }) => existsSync(dir))
      .map(({ dir }) => ({
        model: modelName(dir),
        loadedOn: live.filter((w) => w.loadedOnce.has(dir)).length,
        ...(this.loadErrors.has(dir) && { error: this.loadErrors.get(dir)!.message }),
      }));
    return { ready, models, full: ready === this.options.slots && models.every((m) => m.loadedOn === this.options.slots) };
  }
}
