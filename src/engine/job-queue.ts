/**
 * Runs at most `concurrency` jobs at once and lets at most `maxWaiting` more wait. A waiting job
 * whose signal aborts leaves the queue; a running job is never interrupted (for the engine that would
 * mean killing a worker and the models it loaded), its result is simply not awaited by anyone.
 */

export class QueueFullError extends Error {
  constructor(readonly retryAfterSeconds: number) {
    super('the job queue is full');
    this.name = 'QueueFullError';
  }
}

export class QueueClosedError extends Error {
  constructor() {
    super('the job queue is closed');
    this.name = 'QueueClosedError';
  }
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
    private readonly concurrency: number,
    private readonly maxWaiting: number,
  ) {}

  run<T>(job: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    if (this.closed) return Promise.reject(new QueueClosedError());
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.running >= this.concurrency && this.waiting.length >= this.maxWaiting) {
      const ahead = this.waiting.length / this.concurrency + 1;
      return Promise.reject(new QueueFullError(Math.max(1, Math.ceil(ahead * this.jobSeconds))));
    }
    return new Promise<T>((resolve, reject) => {
      const onAbort = () => entry.cancel(signal!.reason);
      const entry: Waiting = {
        start: () => {
          signal?.removeEventListener('abort', onAbort);
          const started = performance.now();
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
          signal?.removeEventListener('abort', onAbort);
          this.waiting.splice(this.waiting.indexOf(entry), 1);
          reject(reason);
        },
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(entry);
      this.dispatch();
    });
  }

  private dispatch(): void {
    while (this.running < this.concurrency && this.waiting.length) this.waiting.shift()!.start();
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
