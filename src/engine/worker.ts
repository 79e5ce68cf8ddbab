import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { inspect } from 'node:util';
import { ModelLayoutError } from '../models/layout.js';
import type { MemorySource } from '../pipelines/memory-plan.js';
import { GenerationCancelled } from '../pipelines/pipeline.js';
import { WorkerRuntime } from '../pipelines/run.js';
import type { MemoryGrant } from './memory-arbiter.js';
import type { FromWorker, ToWorker, WorkerInit } from './worker-protocol.js';
import { GpuFaultError } from '../runtime/gpu-faults.js';
import type { BatchEvent, GeneratedImage, GenerationBatch, ModelRef } from '../runtime/types.js';
import { messageOf } from '../util/error-message.js';

/**
 * A worker process (started by worker-process.ts): its own process, so that a native crash or the
 * kernel's OOM killer ends only this worker and the batch it ran. It keeps the pipelines it loaded
 * between batches. The settings arrive as the first message; the worker then loads the models to
 * preload, says it is ready, and runs one batch at a time.
 */

/** Resolves once the message is written to the channel: exiting before that could lose a large one. */
const send = (message: FromWorker) => new Promise<void>((resolve) => process.send!(message, undefined, undefined, () => resolve()));

/** What the pool tells the worker's task while it runs: stop, or which of its batch's items' clients left (the others stay). */
interface TaskControl {
  cancelled: boolean;
  left: Set<number>;
}

/** The batch this worker runs, if any; and whether the worker is stopping. */
let running: (TaskControl & { done: Promise<void> }) | undefined;
let stopping = false;

/** The grant the running batch's memory plan (or a calibration) waits for, if any (see pooledMemory). */
let awaitingGrant: { resolve(grant: MemoryGrant): void; reject(err: Error): void; cancellable: boolean } | undefined;
/** Milliseconds this worker has waited for the pool's answers to its memory asks, all tasks together (see taskClock). */
let askedMs = 0;
/** Milliseconds this worker has spent loading sessions (RuntimeOptions.loaded), all tasks together (see taskClock). */
let loadingMs = 0;

/**
 * Asks the pool's arbiter. A batch cancelled meanwhile (or before) stops here rather than wait for
 * memory; a calibration (`cancellable` false) waits on, because a model is calibrated only as it loads.
 */
async function askForMemory(message: Extract<FromWorker, { type: 'memory-ask' | 'memory-wait' }>, cancellable = true): Promise<MemoryGrant> {
  const cancelled = () => cancellable && running?.cancelled;
  if (cancelled()) throw new GenerationCancelled();
  const asked = performance.now();
  const grant = await new Promise<MemoryGrant>((resolve, reject) => {
    awaitingGrant = { resolve, reject, cancellable };
    void send(message);
  }).finally(() => (askedMs += performance.now() - asked));
  if (cancelled()) throw new GenerationCancelled();
  return grant;
}

/**
 * Whoever waits for memory stops waiting: the batch was cancelled, or the worker stops (`stopping`),
 * which ends a calibration's wait too. The pool's arbiter forgets it when the batch fails.
 */
function stopWaitingForMemory(): void {
  if (!awaitingGrant || !(stopping || awaitingGrant.cancellable)) return;
  awaitingGrant.reject(new GenerationCancelled());
  awaitingGrant = undefined;
}

/**
 * Memory as the pool's arbiter grants it (engine/memory-arbiter.ts): every worker's batches are
 * planned one at a time, each counting what the others planned.
 */
const pooledMemory: MemorySource = {
  async reserve(plan) {
    let grant = await askForMemory({ type: 'memory-ask' });
    for (;;) {
      const found = plan(grant.budget, grant.alone);
      if (found) {
        void send({ type: 'memory-take', bytes: found.bytes, samples: found.samples });
        return { plan: found, budget: grant.budget };
      }
      if (grant.alone <= grant.budget || !plan(grant.alone, grant.alone)) {
        void send({ type: 'memory-take', bytes: 0, samples: 0 });
        return { budget: grant.alone };
      }
      grant = await askForMemory({ type: 'memory-wait' });
    }
  },
  async exclusive(work) {
    // While it asks, other batches are granted nothing (the arbiter's 'exclusive'): it waits only for
    // the running ones to end.
    let grant = await askForMemory({ type: 'memory-ask', exclusive: true }, false);
    // Less than all there is: another batch planned on memory it has not taken yet (or on part of MEMORY_LIMIT).
    while (grant.budget < grant.alone) grant = await askForMemory({ type: 'memory-wait' }, false);
    void send({ type: 'memory-take', bytes: grant.budget, samples: 0 });
    try {
      return await work();
    } finally {
      void send({ type: 'memory-release' });
    }
  },
};

/** Built from the settings of the first message ('init'); no batch comes before it. */
let runtime: WorkerRuntime | undefined;

function current(): WorkerRuntime {
  if (!runtime) throw new Error('the worker received a batch before its settings');
  return runtime;
}

/** Loads a model unless this worker holds it, reporting the load (also a reload after an eviction). */
async function ensureLoaded(modelDir: string, version?: string): Promise<void> {
  if (current().holdsModel(modelDir, version)) return;
  const started = performance.now();
  try {
    await current().getPipeline(modelDir, version);
  } catch (err) {
    // A GPU fault is not the model's: the worker ends, saying so, and its replacement loads the model anew.
    if (!(err instanceof GpuFaultError)) void send({ type: 'model-load-failed', modelDir, message: messageOf(err) });
    throw err;
  }
  void send({ type: 'model-loaded', modelDir, seconds: (performance.now() - started) / 1000 });
  reportMemory(modelDir);
}

function reportMemory(modelDir: string): void {
  const memory = current().modelMemory(modelDir);
  if (memory) void send({ type: 'model-memory', modelDir, memory });
}

/** A model that fails to preload is reported by ensureLoaded; requests for it retry the load and get its error. */
async function start({ engine, preload, nice }: WorkerInit): Promise<void> {
  lowerPriority(nice);
  // Functions do not cross the IPC channel: the runtime's warnings go to the server's log as messages.
  runtime = new WorkerRuntime(
    { ...engine, runtime: { ...engine.runtime, warn: (message) => void send({ type: 'warning', message }), loaded: (seconds) => void (loadingMs += seconds * 1000) } },
    pooledMemory,
  );
  for (const { dir, version } of preload) {
    await ensureLoaded(dir, version).catch(async (err: unknown) => {
      if (!(err instanceof GpuFaultError)) return;
      // Ready with a GPU that CUDA refuses this process, it would fail the batches it takes: a new process instead.
      await send({ type: 'warning', message: `${err.message}: after this GPU fault CUDA cannot be used by this worker process, which ends before it is ready; a new one replaces it` });
      process.exit(1);
    });
  }
  void send({ type: 'ready' });
}

/**
 * Step events go to the pool at most this often (the last step of a batch always): a fast model at a
 * small size runs hundreds of steps a second, and a message each would cost the pool's event loop more
 * than the progress is worth. Previews always go.
 */
const STEP_EVENT_INTERVAL_MS = 50;

/**
 * The seconds of a task from now on, for the pool's cost model: by this process's clock, less the
 * waits for the pool's memory grants. The pool's event loop, under a flood of requests, hears and
 * answers late; timed by it (or with its late answers), a batch of 60 ms was taken for seconds. Less
 * its sessions' loads too: the pool times only batches whose model was loaded, but an edit loads the
 * VAE encoder at the model's first one, and timed with that load (0.9 s, where the next edit took 0.04)
 * the model was estimated many times slower than it is, text-to-image too, for batches after.
 */
function taskClock(): () => number {
  const started = performance.now();
  const [askedBefore, loadingBefore] = [askedMs, loadingMs];
  return () => (performance.now() - started - (askedMs - askedBefore) - (loadingMs - loadingBefore)) / 1000;
}

/** Sends the events of a batch whose seconds `clock` tells, thinning its steps to STEP_EVENT_INTERVAL_MS. */
function eventSender(clock: () => number): (event: BatchEvent) => void {
  let lastStep = -Infinity;
  return (event) => {
    if (event.type === 'step' && event.step < event.total) {
      const now = performance.now();
      if (now - lastStep < STEP_EVENT_INTERVAL_MS) return;
      lastStep = now;
    }
    void send({ type: 'event', event, seconds: clock() });
  };
}


/**
 * Runs `work` as the worker's one task (a batch, or a model's load alone), for `modelDir`: its images, or
 * its error, end it. A worker runs one task at a time.
 */
function perform(modelDir: string, work: (task: TaskControl & { clock: () => number }) => Promise<(GeneratedImage | undefined)[]>): void {
  void send({ type: 'started' });
  const task = { cancelled: false, left: new Set<number>(), clock: taskClock(), done: Promise.resolve() };
  task.done = (async () => {
    try {
      const images = await work(task);
      reportMemory(modelDir);
      await send({ type: 'done', images, held: current().heldModels(), seconds: task.clock() });
    } catch (err) {
      // A run that ran out of memory changed the model's figures too (ModelMemory.exceeded).
      reportMemory(modelDir);
      // Only these fields: an error's other properties need not survive serialisation.
      const { name, message, stack } = err instanceof Error ? err : new Error(inspect(err));
      const problem = err instanceof ModelLayoutError ? { problem: err.problem } : {};
      // CUDA refuses this process any further work after such a fault: a new process is the only way on.
      const ending = err instanceof GpuFaultError ? `ended itself after a GPU fault (${err.detail}), after which CUDA cannot be used by the process that met it` : undefined;
      await send({ type: 'failed', error: { name, message, stack, ...problem }, held: current().heldModels(), ...(ending && { ending }) });
      if (ending) process.exit(1);
    } finally {
      // The pool may have heard the answer, and sent the next batch, before its write was done here: that
      // batch is the running one now, and its cancel and the worker's stop must still reach it.
      if (running === task) running = undefined;
    }
  })();
  running = task;
}

const run = (batch: GenerationBatch) =>
  perform(batch.modelDir, async (task) => {
    await ensureLoaded(batch.modelDir, batch.modelVersion);
    return current().runMerged(batch, (item) => task.left.has(item), { shouldStop: () => task.cancelled, onEvent: eventSender(task.clock) });
  });

/** Loads a model with no batch: a preloaded model that could not load when this worker started, tried again. */
const load = (model: ModelRef) =>
  perform(model.dir, async () => {
    await ensureLoaded(model.dir, model.version);
    return [];
  });

/** Releases a model's sessions, and the memory they hold: one requests can no longer name (see model-upkeep.ts's releaseGone). */
const release = (modelDir: string) =>
  perform(modelDir, async () => {
    await current().releaseModel(modelDir);
    return [];
  });

async function stop(): Promise<void> {
  stopping = true;
  if (running) {
    running.cancelled = true;
    stopWaitingForMemory();
    await running.done;
  }
  process.exit(0);
}

process.on('message', (message: ToWorker) => {
  if (stopping) return;
  switch (message.type) {
    case 'init':
      void start(message);
      break;
    case 'run':
      run(message.batch);
      break;
    case 'load':
      load(message.model);
      break;
    case 'release':
      release(message.modelDir);
      break;
    case 'memory-grant':
      awaitingGrant?.resolve(message.grant);
      awaitingGrant = undefined;
      break;
    case 'model-memory':
      current().adoptMemory(message.modelDir, message.memory);
      break;
    case 'cancel':
      if (running) running.cancelled = true;
      stopWaitingForMemory();
      break;
    case 'leave':
      // Sent only while the batch runs, and before the next one's 'run': never another batch's items.
      for (const item of message.items) running?.left.add(item);
      break;
    case 'stop':
      void stop();
      break;
  }
});

const OOM_SCORE_ADJ = '/proc/self/oom_score_adj';
/**
 * On Linux, marks this process as the one the OOM killer should pick before the server: a worker that
 * runs out of memory then costs its own batch, not every request and stored promise of the server.
 * The score is inherited from the server; raising it needs no privilege (1000 is the most there is).
 */
try {
  const inherited = Number(readFileSync(OOM_SCORE_ADJ, 'utf8'));
  writeFileSync(OOM_SCORE_ADJ, String(Math.min(1000, inherited + 500)));
} catch {
  // not Linux, or /proc is not mounted: the kernel's default choice stands
}

/**
 * Lowers this process's CPU priority by `increment` (capped at nice 19). Lowering needs no privilege.
 * On Linux a priority belongs to each thread: every thread there is now (Node's) is lowered, and those
 * made later (onnxruntime's, as models load) inherit it from the thread that makes them. Elsewhere the
 * process's priority is the one to set.
 */
function lowerPriority(increment: number): void {
  if (increment <= 0) return;
  const target = Math.min(19, os.getPriority() + increment);
  let threads: number[];
  try {
    threads = readdirSync('/proc/self/task').map(Number);
  } catch {
    threads = [0];
  }
  for (const thread of threads) {
    try {
      os.setPriority(thread, target);
    } catch {
      // the thread ended meanwhile
    }
  }
}

// The pool went away (it exited or crashed): nobody is left to take this worker's results.
process.on('disconnect', () => process.exit(0));

// A terminal's Ctrl-C (SIGINT) and a service manager's stop (systemd's SIGTERM to every process of the
// unit) reach the workers as well as the server. The server alone decides when they stop: after its
// running requests finished, by a 'stop' message (or SIGKILL); left to the signal, a worker would die at
// once and fail them. SIGHUP (the server reloads its keys) likewise. A worker whose server is gone (its
// channel closed, which also ends it unless native code holds its thread) takes the signal as meant.
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, () => (process.connected ? undefined : process.exit(0)));
