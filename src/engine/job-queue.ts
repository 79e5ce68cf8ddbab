/**
 * Runs at most `concurrency` jobs at once and lets at most `maxWaiting` more wait, each for at most
 * `maxWaitMs`. A waiting job whose signal aborts leaves the queue; a running job is never interrupted
 * (for the engine that would mean killing a worker and the models it loaded), its result is simply not
 * awaited by anyone. The concurrency can change (workers come up, die and are replaced), so waiting jobs
 * start only once there is a worker ready for them.
 */

export class QueueFullError extends Error {
  constructor(readonly retryAfterSeconds: number) {
    super('the job queue is full');
    this.name = 'QueueFullError';
  }
}

export class QueueTimeoutError extends Error {
  constructor(
    readonly waitedSeconds: number,
    readonly retryAfterSeconds: number,
  ) {
    super(`the job waited ${waitedSeconds}s without getting a worker`);
    this.name = 'QueueTimeoutError';
  }
}

export class QueueClosedError extends Error {
  constructor() {
    super('the job queue is closed');
    this.name = 'QueueClosedError';
  }
}

export interface JobQueueOptions {
  /** Longest a job may wait; it then leaves the queue with QueueTimeoutError. */
  maxWaitMs?: number;
  /** Told how long each job waited before it started (for metrics). */
  onStart?(waitedMs: number): void;
}

interface Waiting {
  start(): void;
  cancel(reason: unknown): void;
}

/** Seconds one job is assumed to take until some have been timed. */
const INITIAL_JOB_SECONDS = 5;

export class JobQueue {
  private readonly waiting: Waiting[] = [];
  private running = 0;
  private closed = false;
  /** Moving average of job durations, for Retry-After. */
  private jobSeconds = INITIAL_JOB_SECONDS;

  constructor(
    private concurrency: number,
    private readonly maxWaiting: number,
    private readonly options: JobQueueOptions = {},
  ) {}

  run<T>(job: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    if (this.closed) return Promise.reject(new QueueClosedError());
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.running >= this.concurrency && this.waiting.length >= this.maxWaiting) {
      return Promise.reject(new QueueFullError(this.retryAfterSeconds()));
    }
    return new Promise<T>((resolve, reject) => {
      const queued = performance.now();
      const onAbort = () => entry.cancel(signal!.reason);
      const timer =
        this.options.maxWaitMs === undefined
          ? undefined
          : setTimeout(() => entry.cancel(new QueueTimeoutError(Math.round((performance.now() - queued) / 1000), this.retryAfterSeconds())), this.options.maxWaitMs);
      const leave = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      const entry: Waiting = {
        start: () => {
          leave();
          const started = performance.now();
          this.options.onStart?.(started - queued);
          this.running++;
          job()
            .then(resolve, reject)
            .finally(() => {
              this.running--;
              this.jobSeconds = 0.8 * this.jobSeconds + 0.2 * ((performance.now() - started) / 1000);
              this.dispatch();
            });
        },
        cancel: (reason) => {
          leave();
          this.waiting.splice(this.waiting.indexOf(entry), 1);
          reject(reason);
        },
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(entry);
      this.dispatch();
    });
  }

  /** How many jobs may run at once from now on; more waiting jobs start at once if it grew. */
  setConcurrency(concurrency: number): void {
    this.concurrency = concurrency;
    this.dispatch();
  }

  private dispatch(): void {
    while (this.running < this.concurrency && this.waiting.length) this.waiting.shift()!.start();
  }

  /** When the jobs ahead of a newcomer should be done, at the average job duration. */
  private retryAfterSeconds(): number {
    const ahead = this.waiting.length / Math.max(1, this.concurrency) + 1;
    return Math.max(1, Math.ceil(ahead * this.jobSeconds));
  }

  load(): { running: number; queued: number } {
    return { running: this.running, queued: this.waiting.length };
  }

  /** Rejects the waiting jobs with QueueClosedError and refuses new ones; running jobs go on. */
  close(): void {
    this.closed = true;
    for (const entry of [...this.waiting]) entry.cancel(new QueueClosedError());
  }
}
