import { fork, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ModelMemory } from '../models/memory-figures.js';
import { eachOutputLine, readOutputLine, type OutputLine } from '../runtime/native-output.js';
import type { BatchEvent, GeneratedImage, GenerationBatch, ModelRef } from '../runtime/types.js';
import type { LeftItems } from './left-items.js';
import { workerEnvironment } from './malloc-tunables.js';
import type { MemoryClaimant, MemoryGrant } from './memory-arbiter.js';
import type { FromWorker, ToWorker, WorkerInit } from './worker-protocol.js';

/**
 * The pool's handle on one worker process (worker.ts): starts it, hands it one batch at a time, and
 * notices when it dies. A process rather than a thread because a segfault in native code, or the
 * kernel killing it for memory, then ends only the worker: its batch fails with WorkerDiedError and
 * the server goes on.
 */

/**
 * The process running a batch died (crash, out of memory, killed); the pool starts a new one.
 * `batchStarted` false: it died before it took the batch (it was already dead when the batch was
 * sent, its 'close' not yet seen), so the batch never ran and may run elsewhere.
 */
export class WorkerDiedError extends Error {
  /**
   * `killedBySystem`: it got SIGKILL from outside the pool (the kernel's OOM killer is the usual
   * sender; see pool.ts), not from the pool's own watchdog or shutdown.
   */
  constructor(
    readonly reason: string,
    readonly batchStarted = true,
    readonly killedBySystem = false,
    /** The signal that ended it, if one did. */
    readonly signal?: NodeJS.Signals,
  ) {
    super(`the worker process running the batch ${reason}`);
    this.name = 'WorkerDiedError';
  }
}

/** What the handle tells its owner. */
export interface WorkerListener {
  /** Model loads, their memory and readiness, its batches' memory plans and its warnings, as the worker reports them. */
  event(worker: WorkerProcess, message: Extract<FromWorker, { type: 'model-loaded' | 'model-load-failed' | 'model-memory' | 'ready' | 'warning' | `memory-${string}` }>): void;
  /**
   * The process ended; `reason` says how, for logs; `hadBatch`: it was running one, which failed; `task`:
   * what it was doing otherwise, said after the reason (e.g. "while loading model 'x'", or "before it
   * began the batch it was handed"). Called once, after that batch or task failed.
   */
  exit(worker: WorkerProcess, reason: string, hadBatch: boolean, task?: string): void;
  /**
   * It said it ends (FromWorker 'failed' `ending`): alive still, it is no longer ready. Told before the
   * batch it failed settles, so that the next waiting batch is not counted a worker it cannot have.
   */
  unready(worker: WorkerProcess): void;
  /** A line the process wrote to its stdout or stderr (onnxruntime's own warnings and errors, a crash's last words). */
  output(worker: WorkerProcess, line: OutputLine): void;
}

interface Task {
  /** The worker said it took the batch. */
  started: boolean;
  /** A batch, rather than a model's load alone (which proves nothing of the worker: see batchesDone). */
  batch: boolean;
  /** What a task other than a batch does, for the log of a death during it (e.g. "while loading model 'x'"). */
  doing?: string;
  resolve(images: (GeneratedImage | undefined)[]): void;
  reject(err: Error): void;
  onProgress(): void;
  onEvent?(event: BatchEvent): void;
}

/**
 * The worker module: `script`, or the one next to this module in the same language (worker.ts under
 * tsx/vitest, worker.js when built). Workers run with --expose-gc so that what a model's load leaves as
 * garbage is collected before its memory is measured (settledResidentBytes in runtime/memory.ts).
 */
function workerModule(script?: string): { file: string; execArgv: string[] } {
  const file = script ?? fileURLToPath(new URL(`./worker${path.extname(fileURLToPath(import.meta.url))}`, import.meta.url));
  return { file, execArgv: ['--expose-gc', ...(path.extname(file) === '.ts' ? ['--import', 'tsx'] : [])] };
}

/** How a worker process is started. */
export interface WorkerSpawn {
  /** The worker module to run (see workerModule). */
  script?: string;
  /** Whether its malloc asks for huge pages (malloc-tunables.ts); default true. */
  mallocHugePages?: boolean;
}

/**
 * How long a worker that said it ends (FromWorker 'failed' `ending`) has to exit before it is killed. Its
 * exit runs onnxruntime's and CUDA's teardown, which a driver that lost the GPU can hang in; alive and
 * given nothing, it would hold its slot for good, and the slot would never start its replacement.
 */
const ENDING_GRACE_MS = 5000;

/** How logs and errors name a model: by its folder's name. */
export const modelName = (modelDir: string) => path.basename(modelDir);

function describeExit(code: number | null, signal: NodeJS.Signals | null): string {
  if (signal === 'SIGKILL') return 'was killed (SIGKILL; the system may have run out of memory)';
  if (signal) return `crashed (${signal})`;
  return `exited with code ${code}`;
}

export class WorkerProcess implements MemoryClaimant {
  /** Preloading is over and the process is alive: the worker takes batches. */
  ready = false;
  /** Batches it completed: the pool's restart backoff asks. */
  batchesDone = 0;
  /** Denoising steps done in the running (or else the last) batch. */
  step = 0;
  /**
   * Seconds the running (or else the last) batch had taken at its latest report, by the worker's own
   * clock and less its waits for this process's memory grants and its sessions' loads (the VAE encoder's,
   * at a model's first edit): what the batch cost, however late this process's event loop heard of it or answered it.
   */
  seconds = 0;
  /** Seconds the running (or else the last) task spent loading models, by the worker's clock: the pool times its batch without them. */
  loadSeconds = 0;
  /** The memory the running (or else the last) batch was last granted, and the samples per model call it planned (see memory-arbiter.ts, Pipeline.samplesPerImage). */
  grant?: MemoryGrant;
  plannedSamples?: number;
  alive = true;
  /** Model folders this worker holds now, as of its last load or batch. */
  readonly loaded = new Set<string>();
  /** Model folders this worker has loaded at some time (for /ready: a preloaded model evicted since is still served, by loading it again). */
  readonly loadedOnce = new Set<string>();
  /** When the process has ended. */
  readonly exited: Promise<void>;
  private readonly child: ChildProcess;
  private task?: Task;
  /** Why the pool killed it, which then says more than the signal. */
  private killedBecause?: string;
  /** Why the worker said it was ending (FromWorker 'failed' `ending`), which then says more than its exit code. */
  private endingBecause?: string;

  constructor(
    init: WorkerInit,
    private readonly listener: WorkerListener,
    { script, mallocHugePages = true }: WorkerSpawn = {},
  ) {
    const { file, execArgv } = workerModule(script);
    // fork() throws for some failures to start (ENOMEM) and reports others as an 'error' event. Its
    // output is read here, not inherited: onnxruntime writes its own lines there (see native-output.ts).
    // The environment as it is now, as fork's default would take it, with the tunables added.
    const env = workerEnvironment(mallocHugePages);
    this.child = fork(file, [], { execArgv, env, serialization: 'advanced', stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
    for (const stream of ['stdout', 'stderr'] as const) {
      // None where its pipes could not be made (EMFILE, ENFILE: the process never started, its 'error' says so).
      const output = this.child[stream];
      if (!output) continue;
      eachOutputLine(output, (text) => {
        const line = readOutputLine(text, stream);
        if (line) this.listener.output(this, line);
      });
    }
    // 'close' rather than 'exit': it comes after the last message, so a result sent just before the
    // process ended is not taken for a crash.
    this.exited = new Promise((resolve) =>
      this.child.once('close', (code: number | null, signal: NodeJS.Signals | null) => {
        this.died(this.killedBecause ?? this.endingBecause ?? describeExit(code, signal), signal === 'SIGKILL' && this.killedBecause === undefined, signal ?? undefined);
        resolve();
      }),
    );
    // Without a pid the process never started (EMFILE, EAGAIN): its 'close' that follows says only a code.
    this.child.on('error', (err) => {
      if (this.child.pid === undefined) this.died(`could not be started: ${err.message}`);
    });
    this.child.on('message', (message: FromWorker) => this.receive(message));
    this.send(init);
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  get busy(): boolean {
    return this.task !== undefined;
  }

  /** The pool ended it (kill), rather than it exiting or the system killing it. */
  get killed(): boolean {
    return this.killedBecause !== undefined;
  }

  /** It said it was ending (after the batch it failed), rather than dying unasked. */
  get endedItself(): boolean {
    return this.endingBecause !== undefined;
  }

  /**
   * Runs a batch; `stop` aborting makes the worker stop at its next step (the promise then rejects).
   * `onProgress` hears of each denoising step done and of each model loaded for it; `onEvent` gets the
   * batch's events (BatchEvent). The items in `left` (their clients left, others staying) get no image.
   */
  run(batch: GenerationBatch, stop: AbortSignal, onProgress: () => void, onEvent?: (event: BatchEvent) => void, left?: LeftItems): Promise<(GeneratedImage | undefined)[]> {
    const done = this.assign({ type: 'run', batch }, { batch: true, onProgress, onEvent });
    const cancel = () => this.send({ type: 'cancel' });
    stop.addEventListener('abort', cancel, { once: true });
    if (stop.aborted) cancel();
    const unlisten = left?.listen((items) => this.send({ type: 'leave', items: [...items] }));
    return done.finally(() => {
      stop.removeEventListener('abort', cancel);
      unlisten?.();
    });
  }

  /** Loads a model with no batch (see ToWorker 'load'); rejects with why it could not, as a batch would. */
  async load(model: ModelRef, onProgress: () => void): Promise<void> {
    await this.assign({ type: 'load', model }, { batch: false, onProgress, doing: `while loading model '${modelName(model.dir)}'` });
  }

  /** Releases a model the worker holds (see ToWorker 'release'). */
  async release(modelDir: string, onProgress: () => void): Promise<void> {
    await this.assign({ type: 'release', modelDir }, { batch: false, onProgress, doing: `while releasing model '${modelName(modelDir)}'` });
  }

  /** Hands the worker its one task; it settles with the task's images or error. */
  private assign(message: Extract<ToWorker, { type: 'run' | 'load' | 'release' }>, task: Pick<Task, 'batch' | 'doing' | 'onProgress' | 'onEvent'>): Promise<(GeneratedImage | undefined)[]> {
    if (!this.alive || !this.ready || this.task) throw new Error('the worker cannot take a task now');
    return new Promise<(GeneratedImage | undefined)[]>((resolve, reject) => {
      this.task = { started: false, resolve, reject, ...task };
      this.step = 0;
      this.seconds = 0;
      this.loadSeconds = 0;
      this.grant = undefined;
      this.plannedSamples = undefined;
      this.send(message);
    });
  }

  /** Asks the worker to stop its batch and exit; kills it if it has not within `graceMs` (e.g. busy loading a model). */
  async stop(graceMs: number): Promise<void> {
    if (!this.alive) return;
    this.send({ type: 'stop' });
    const timer = setTimeout(() => this.kill(`did not stop within ${graceMs / 1000} s and was killed`), graceMs);
    await this.exited;
    clearTimeout(timer);
  }

  /** The pool's arbiter answers the running batch's memory plan (see memory-arbiter.ts). */
  grantMemory(grant: MemoryGrant): void {
    // The end of a wait for memory: the batch's first step is still to come, and the stall watchdog counts from here.
    this.task?.onProgress();
    this.grant = grant;
    this.send({ type: 'memory-grant', grant });
  }

  /** Sends the pool's figures of a model (see pool.ts's recordMemory). */
  shareMemory(modelDir: string, memory: ModelMemory): void {
    this.send({ type: 'model-memory', modelDir, memory });
  }

  /** Ends the process at once (SIGKILL); `reason` is what its batch's error and the logs will say. */
  kill(reason: string): void {
    this.killedBecause ??= reason;
    this.child.kill('SIGKILL');
  }

  private receive(message: FromWorker): void {
    switch (message.type) {
      case 'started':
        if (this.task) this.task.started = true;
        return;
      case 'event':
        if (message.event.type === 'step') this.step = message.event.step;
        this.seconds = message.seconds;
        this.task?.onProgress();
        this.task?.onEvent?.(message.event);
        return;
      case 'done':
        if (this.task?.batch) this.batchesDone++;
        this.seconds = message.seconds;
        this.hold(message.held);
        this.finish()?.resolve(message.images);
        return;
      case 'failed':
        this.hold(message.held);
        // Given nothing more: it exits, and its slot's replacement takes the next batch.
        if (message.ending !== undefined) {
          this.endingBecause = message.ending;
          this.ready = false;
          const timer = setTimeout(() => this.kill(`${message.ending}, and was killed: it had not exited ${ENDING_GRACE_MS / 1000} s after saying so`), ENDING_GRACE_MS);
          void this.exited.then(() => clearTimeout(timer));
          this.listener.unready(this);
        }
        this.finish()?.reject(Object.assign(new Error(message.error.message), message.error));
        return;
      case 'ready':
        this.ready = true;
        break;
      case 'model-loaded':
        this.loaded.add(message.modelDir);
        this.loadedOnce.add(message.modelDir);
        if (this.task) this.loadSeconds += message.seconds;
        this.task?.onProgress();
        break;
      case 'memory-take':
        this.plannedSamples = message.samples;
        break;
    }
    this.listener.event(this, message);
  }

  private hold(modelDirs: readonly string[]): void {
    this.loaded.clear();
    for (const dir of modelDirs) this.loaded.add(dir);
  }

  private finish(): Task | undefined {
    const task = this.task;
    this.task = undefined;
    return task;
  }

  private died(reason: string, killedBySystem = false, signal?: NodeJS.Signals): void {
    if (!this.alive) return;
    this.alive = false;
    this.ready = false;
    const task = this.finish();
    task?.reject(new WorkerDiedError(reason, task.started, killedBySystem, signal));
    // A batch it never took waits for another worker (pool.ts): only one it had started fails. A load or
    // a release it was given is said whether it took it or not: it held the worker all the same. A batch
    // it was handed but never began (dead already, or hung, as the stall watchdog then finds it) is said
    // too: said to be "while idle", the kill of a worker hung as a batch reached it read as if it had none.
    const unbegun = task?.batch && !task.started ? 'before it began the batch it was handed (which waits for another worker)' : undefined;
    this.listener.exit(this, reason, task?.batch === true && task.started, task?.doing ?? unbegun);
  }

  /** A message the dead process cannot take is dropped: its exit is handled by died(). */
  private send(message: ToWorker): void {
    if (this.child.connected) this.child.send(message, () => undefined);
  }
}
