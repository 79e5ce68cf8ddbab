import type { Logger } from 'pino';
import type { JobQueue } from './job-queue.js';
import { modelName, type WorkerProcess } from './worker-process.js';
import type { WorkerSlots } from './worker-slots.js';

/**
 * The pool's upkeep of the models its workers hold, which no request asks for: a preloaded model that
 * failed to load is loaded again once its folder changed (WorkerSlots.preloadsToRetry), and a model whose
 * folder the model scan no longer finds usable is released. Each is a task of one idle worker, one at a
 * time per model and kind, run only on a worker no client's job may take (JobQueue.runIfIdle, which
 * holds the worker for it): it is no client's work, and waits for none.
 */

/** How often the upkeep looks for models to load again or release: a cheap look, no files read. */
const LOOK_MS = 2000;

/** A task on one worker; `progress` restarts its stall watchdog (see ModelUpkeepOptions.guard). */
type WorkerTask = (worker: WorkerProcess, progress: () => void) => Promise<void>;

export interface ModelUpkeepOptions {
  slots: Pick<WorkerSlots, 'idle' | 'ready' | 'preloadsToRetry'>;
  queue: Pick<JobQueue, 'runIfIdle'>;
  /** Runs a task on `worker` under the guard the pool gives a batch too (pool.ts's onWorker). */
  guard(worker: WorkerProcess, task: (progress: () => void) => Promise<void>): Promise<void>;
  /** See WorkerSlotsOptions.modelVersion; without it there is no upkeep (nothing says a model changed or went). */
  modelVersion?(dir: string): string | undefined;
  logger?: Logger;
}

/** Starts looking every LOOK_MS; returns what stops it. */
export function startModelUpkeep({ slots, queue, guard, modelVersion, logger }: ModelUpkeepOptions): () => void {
  // Without it nothing says a model changed or went: there is nothing to look for.
  if (!modelVersion) return () => undefined;
  const versionOf = modelVersion;
  /** The tasks running, by kind and folder: a look does not start one again (on another worker) while it runs. */
  const inFlight = new Set<string>();

  /**
   * Starts `task` under `key` unless it runs, on the idle worker `pick` chooses, if the queue lets a
   * worker be taken now; else the next look tries again (the workers are busy with clients' jobs). It
   * runs under the guard a batch has: a load or a release that hangs would otherwise hold its worker for
   * good. A task that fails is tried at the next look that still finds it needed.
   */
  function attempt(key: string, pick: (idle: WorkerProcess[]) => WorkerProcess | undefined, task: WorkerTask): void {
    if (inFlight.has(key)) return;
    const worker = pick(slots.idle());
    const running = worker && queue.runIfIdle(() => guard(worker, (progress) => task(worker, progress)));
    if (!running) return;
    inFlight.add(key);
    void running.catch(() => undefined).finally(() => inFlight.delete(key));
  }

  /**
   * Loads each preloaded model that a ready worker lacks and may now load. A load that fails again is
   * recorded (and logged) by the slots, and tried once more only after its folder changes again.
   */
  function retryPreloads(): void {
    for (const model of slots.preloadsToRetry()) {
      attempt(`load ${model.dir}`, (idle) => idle.find((w) => !w.loadedOnce.has(model.dir)), (worker, progress) => worker.load(model, progress));
    }
  }

  /**
   * Releases, one worker at a time, each model a worker holds whose folder the model scan no longer
   * finds usable (removed by `models remove`, or damaged): no request can name it now, and its sessions
   * held their memory until the budget happened to evict them, for good with the budget to spare (a
   * removed SDXL's gigabytes, in every worker that had run it). Batches of it still waiting for a worker
   * then find it gone (400, "removed while this request waited").
   */
  function releaseGone(): void {
    for (const dir of new Set(slots.ready().flatMap((worker) => [...worker.loaded]))) {
      if (versionOf(dir) !== undefined) continue;
      attempt(`release ${dir}`, (idle) => idle.find((w) => w.loaded.has(dir)), async (worker, progress) => {
        await worker.release(dir, progress);
        logger?.info({ model: modelName(dir), workerPid: worker.pid }, 'released a model that is no longer installed or usable, and its memory');
      });
    }
  }

  const looks = setInterval(() => {
    retryPreloads();
    releaseGone();
  }, LOOK_MS);
  looks.unref();
  return () => clearInterval(looks);
}
