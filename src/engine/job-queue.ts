import { FairOrder } from './fair-order.js';

/**
 * Runs at most `concurrency` jobs at once and lets more wait, bounded by their number (`maxWaiting`)
 * and by the estimated seconds of work waiting (`maxQueuedSeconds`). A job belongs to a request (a
 * Ticket): the request is admitted, or refused with QueueFullError, as a whole when its first job
 * arrives, and it waits at most `maxWaitMs` for its FIRST job to start; its later jobs never time out
 * behind its earlier ones. Waiting jobs start in fair order across clients (fair-order.ts): a client
 * flooding expensive work delays another's cheap job by at most the jobs already running.
 *
 * A waiting job whose signal aborts leaves the queue; a running job is never interrupted (for the
 * engine that would mean killing a worker and the models it loaded), its result is simply not awaited
 * by anyone. A running job that rejects with RequeueError did not run after all (its worker was gone)
 * and goes back to the head of its client's line. The concurrency can change (workers come up, die and
 * are replaced), so waiting jobs start only once there is a worker ready for them.
 */

/** Who a request without a client of its own (no API keys) is, for the queue's fairness. */
const ANONYMOUS_CLIENT = 'anonymous';

export class QueueFullError extends Error {
  constructor(
    readonly retryAfterSeconds: number,
    /** The setting that refused the request: too many jobs waiting, or too much work. */
    readonly limit: 'QUEUE_MAX' | 'QUEUE_MAX_SECONDS',
  ) {
    super('the job queue is full');
    this.name = 'QueueFullError';
  }
}

/** When to try again after no worker was ready to take a job: a worker restarts within seconds, or its backoff says more. */
const NO_WORKER_RETRY_SECONDS = 5;

export class QueueTimeoutError extends Error {
  constructor(
    readonly waitedSeconds: number,
    readonly retryAfterSeconds: number,
    /** No job could run at all when it gave up: no worker was ready (starting, or restarting after crashes), not busy ones. */
    readonly noWorker = false,
    /** The client's own `maxConcurrent` that held it: its other jobs were running (workers may have been free). */
    readonly clientLimit?: number,
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

/** A running job rejects with this when it never ran (its worker was already gone): it waits again. */
export class RequeueError extends Error {
  constructor(readonly cause: Error) {
    super(`the job did not run (${cause.message}) and waits again`);
    this.name = 'RequeueError';
  }
}

/** Per-client bounds, e.g. per API key; a client without them is bound only by the queue's. */
export interface ClientLimits {
  /** Jobs of this client that may run at once; the others wait (other clients' jobs go first). */
  maxConcurrent?: number;
}

/**
 * One request's claim on the queue: who sent it and what all its jobs are estimated to cost. It is
 * admitted with its first job; once any of its jobs starts, none of its jobs times out any more.
 */
export class Ticket {
  admitted = false;
  started = false;
  private readonly onStart = new Set<() => void>();
  /** When the request began to wait, outside the queue (waitOutside) or in it. */
  private waitingSince?: number;

  constructor(
    readonly client = ANONYMOUS_CLIENT,
    /** Estimated seconds of all the request's jobs, for admission. */
    readonly cost = 0,
    readonly limits: ClientLimits = {},
  ) {}

  /** The request got a worker (or joined a batch that did): its other jobs wait without a time limit. */
  begin(): void {
    if (this.started) return;
    this.started = true;
    for (const disarm of this.onStart) disarm();
    this.onStart.clear();
  }

  /**
   * The ms the request has waited for its first job to start, its wait's clock started now if it had
   * not begun to wait: what it waited outside the queue (for room for its answer, for its key's slot)
   * counts against the same maxWaitMs as its time in the queue.
   */
  waited(): number {
    this.waitingSince ??= performance.now();
    return performance.now() - this.waitingSince;
  }

  /** Calls `disarm` when the request starts; returns what cancels that. */
  whenStarted(disarm: () => void): () => void {
    this.onStart.add(disarm);
    return () => this.onStart.delete(disarm);
  }
}

export interface JobOptions {
  /** The request the job belongs to; without one, the job is a request of its own. */
  ticket?: Ticket;
  /** The job's estimated seconds, read when it is weighed (it may grow while it waits, as merged batches do). */
  cost?: () => number;
  /**
   * Whose work the job is, for the fair order, read as it starts: the estimated seconds of each client's
   * share. By default all of it is its ticket's client's; a batch that merged several clients' requests
   * charges each its own images, or a client riding in another's batch would be served free and the
   * batch's owner charged for it.
   */
  shares?: () => Map<string, number>;
  /**
   * The caller bounds the wait of each request the job serves, each by its own ticket (boundWait), and
   * aborts `signal` once all of them gave up: a merged batch, whose first request timing out must not
   * drop the requests that joined it later. The queue then bounds only a requeued job's wait.
   */
  boundsOwnWait?: boolean;
}

export interface JobQueueOptions {
  /** Longest a request may wait for its first job to start; it then leaves the queue with QueueTimeoutError. */
  maxWaitMs?: number;
  /** Most estimated seconds of work that may wait per unit of concurrency before new requests are refused. */
  maxQueuedSeconds?: number;
  /** Told how long each job waited, until it started or gave up at maxWaitMs (for metrics). */
  onWaited?(waitedMs: number): void;
}

/** What a job hears of itself as it runs (JobQueue.run). */
export interface RunningJob {
  /** Gives `client` back `seconds` of what this job charged it as it started, which it will not get (see JobQueue.refund). */
  refund(client: string, seconds: number): void;
  /** The share (0..1) of its work done, as last heard: what it has left once it outlasts its estimate (see secondsLeft). */
  progress(done: number): void;
}

interface Entry {
  ticket: Ticket;
  cost(): number;
  shares(): Map<string, number>;
  start(): void;
  cancel(reason: unknown): void;
}

/** Seconds a job without an estimate is assumed to take, until jobs have been timed. */
const INITIAL_JOB_SECONDS = 5;

/** A running job's: what it was charged for as it started, when, and the share of its work done since, as last heard (RunningJob.progress). */
interface Run {
  charged: Map<string, number>;
  startedAt: number;
  done: number;
}

/**
 * Estimated seconds a running job has left at `now`: what its estimate leaves, and once it outlasts it,
 * what its progress so far says the rest takes. Taken as ending any moment then, a job that a model's
 * new size or a loaded machine made take many times its estimate had every refused client told to retry
 * in 1 s, again and again until it ended (the SDKs' retries ran out first). The estimate goes first:
 * early on, the time of the first step (the text encoders) makes progress a poor guess of the rest.
 */
function secondsLeft(entry: Entry, { startedAt, done }: Run, now: number): number {
  const elapsed = (now - startedAt) / 1000;
  const left = entry.cost() - elapsed;
  if (left > 0) return left;
  return done > 0 && done < 1 ? (elapsed * (1 - done)) / done : 0;
}

/** What waits, or would: each job's (or request's) client and weight (its estimated seconds, or 1 to count jobs). */
type Waiting = { client: string; cost: number }[];

const total = (waiting: Waiting): number => waiting.reduce((sum, { cost }) => sum + cost, 0);

/**
 * Whether what waits is over its bound (QUEUE_MAX jobs, or QUEUE_MAX_SECONDS of work) because of
 * another client: `client` has nothing waiting while one other client holds more than half of it.
 * Such a newcomer is admitted while what all but that client hold stays under the bound: one client's
 * flood (many jobs, or a few long ones: one request of ten large images may be many times the bound)
 * would otherwise keep every other client out, though the fair order starts a newcomer's job ahead of
 * most of the flood. The flood's own further requests are still refused, so it stays within the bound
 * and one request of its own, and so does what the others add.
 */
function floodedBy(client: string, waiting: Waiting, bound: number): boolean {
  if (waiting.some((other) => other.client === client)) return false;
  const held = new Map<string, number>();
  for (const other of waiting) held.set(other.client, (held.get(other.client) ?? 0) + other.cost);
  const heaviest = Math.max(0, ...held.values());
  const size = total(waiting);
  return heaviest > size / 2 && size - heaviest < bound;
}

/** Seconds (at least 1) until the first of these running jobs should end: a worker, or a slot of its client's, is free then. */
function firstToEnd(running: [Entry, Run][]): number {
  if (running.length === 0) return 1;
  const now = performance.now();
  return Math.max(1, Math.ceil(Math.min(...running.map(([entry, run]) => secondsLeft(entry, run, now)))));
}

export class JobQueue {
  private readonly order = new FairOrder<Entry>();
  /** Requests waiting outside the queue for what they need before their jobs may queue (see waitOutside). */
  private readonly outside = new Set<Ticket>();
  /** The running jobs: the cost each charged to its clients when it started, when that was, and its progress since. */
  private readonly running = new Map<Entry, Run>();
  private readonly runningByClient = new Map<string, number>();
  /** Upkeep jobs running (see runIfIdle): each holds a worker, and none is a client's. */
  private upkeep = 0;
  private closed = false;
  /** Moving average of the durations of jobs without an estimate, for Retry-After. */
  private jobSeconds = INITIAL_JOB_SECONDS;

  constructor(
    private concurrency: number,
    private readonly maxWaiting: number,
    private readonly options: JobQueueOptions = {},
  ) {}

  run<T>(job: (running: RunningJob) => Promise<T>, signal?: AbortSignal, { ticket = new Ticket(), cost, shares, boundsOwnWait = false }: JobOptions = {}): Promise<T> {
    if (this.closed) return Promise.reject(new QueueClosedError());
    if (signal?.aborted) return Promise.reject(signal.reason);
    const refusal = this.admit(ticket);
    if (refusal) return Promise.reject(refusal);
    const weigh = cost ?? (() => this.jobSeconds);
    return new Promise<T>((resolve, reject) => {
      let queued = 0;
      const onAbort = () => entry.cancel(signal!.reason);
      let disarm: () => void = () => {};
      /**
       * Waits in line. The wait is bounded until the request starts; a requeued job (`again`) is bounded
       * once more, since its request may have nothing else running for it.
       */
      const wait = (again: boolean) => {
        queued = performance.now();
        signal?.addEventListener('abort', onAbort, { once: true });
        disarm = again || !boundsOwnWait ? this.limitWait(ticket, (err) => entry.cancel(err), !again) : () => undefined;
        if (again) this.order.pushFront(ticket.client, entry);
        else this.order.push(ticket.client, entry);
      };
      const leave = () => {
        disarm();
        signal?.removeEventListener('abort', onAbort);
      };
      const entry: Entry = {
        ticket,
        cost: weigh,
        shares: shares ?? (() => new Map([[ticket.client, weigh()]])),
        start: () => {
          leave();
          ticket.begin();
          const started = performance.now();
          this.options.onWaited?.(started - queued);
          this.began(entry);
          // Its worker is free again as it settles, before it waits again or anything starts: ended one
          // turn later, a job that waited again could start (on another job's end) meanwhile, and its
          // first run's end then took its second run's place off the running jobs, letting one job too many run.
          const end = () => {
            this.ended(entry);
            if (!cost) this.jobSeconds = 0.8 * this.jobSeconds + 0.2 * ((performance.now() - started) / 1000);
          };
          const progress = (done: number) => {
            const run = this.running.get(entry);
            if (run) run.done = done;
          };
          job({ refund: (client, seconds) => this.refund(entry, client, seconds), progress }).then(
            (value) => {
              end();
              resolve(value);
              this.dispatch();
            },
            (err: unknown) => {
              const again = err instanceof RequeueError && !this.closed && !signal?.aborted;
              // The job did not run: its charge is refunded and it waits at the head of its client's line.
              if (again) for (const [client, work] of this.running.get(entry)?.charged ?? []) this.order.charge(client, -work);
              end();
              if (again) wait(true);
              else if (!(err instanceof RequeueError)) reject(err);
              else reject(this.closed ? new QueueClosedError() : signal!.reason);
              this.dispatch();
            },
          );
        },
        cancel: (reason) => {
          leave();
          this.order.remove(entry);
          reject(reason);
        },
      };
      wait(false);
      this.dispatch();
    });
  }

  /**
   * Admits the request of `ticket` unless it was already (with an earlier job of it, or its place
   * outside: waitOutside), or answers why it may not wait. For a request joining a job that waits
   * already (a merged batch: see batcher.ts) too, which adds its work to what waits as its own job would.
   */
  admit(ticket: Ticket): QueueFullError | undefined {
    if (ticket.admitted) return undefined;
    const refusal = this.refusal(ticket);
    ticket.admitted = refusal === undefined;
    return refusal;
  }

  /**
   * Bounds the wait of a request that is one of several a job serves (a merged batch: see
   * JobOptions.boundsOwnWait), as its own job's wait is bounded: `expire` gets its QueueTimeoutError
   * once maxWaitMs passed and the request has not started. Returns what cancels it.
   */
  boundWait(ticket: Ticket, expire: (err: QueueTimeoutError) => void): () => void {
    return this.limitWait(ticket, expire, true);
  }

  /**
   * Calls `expire` with a QueueTimeoutError once maxWaitMs passed, unless cancelled (by what this
   * returns) first, or the ticket started while `untilStarted`: nothing at all when it has already.
   * Until the request starts, the time it waited before it queued counts (Ticket.waited): a request
   * that waited for room for its answer, then its key's slot, then a worker, waited at most maxWaitMs
   * in all, not that much for each. A requeued job's wait (not `untilStarted`) is bounded afresh.
   */
  private limitWait(ticket: Ticket, expire: (err: QueueTimeoutError) => void, untilStarted: boolean): () => void {
    const limit = this.options.maxWaitMs;
    if (limit === undefined || (untilStarted && ticket.started)) return () => undefined;
    const queued = performance.now();
    const waitedBefore = untilStarted ? ticket.waited() : 0;
    const timer = setTimeout(() => expire(this.timedOut(queued, waitedBefore, ticket)), Math.max(0, limit - waitedBefore));
    const forget = untilStarted ? ticket.whenStarted(() => clearTimeout(timer)) : () => undefined;
    return () => (clearTimeout(timer), forget());
  }

  /**
   * Gives `client` back `seconds` of the work it was charged for as the running job `entry` started
   * (its share of a merged batch), which it will not get: its request left the job. Charged for all of
   * it, a client that cancels waits behind the others' requests for work it did not get. What is given
   * back leaves the job's charge, so that a job that then did not run after all (RequeueError) refunds
   * only the rest; nothing once the job ended. By the job, not its ticket: a request's batches share
   * one, and may run at once on several workers, each charged apart (see RunningJob).
   */
  private refund(entry: Entry, client: string, seconds: number): void {
    const charged = this.running.get(entry)?.charged;
    const back = Math.min(seconds, charged?.get(client) ?? 0);
    if (!charged || back <= 0) return;
    charged.set(client, (charged.get(client) ?? 0) - back);
    this.order.charge(client, -back);
  }

  /**
   * Runs `job` at once if a worker is free, and answers its promise; else undefined (the caller tries
   * again later). For the workers' upkeep (model-upkeep.ts), which is no client's work: it holds a
   * worker as a job does, but never waits in line, so it takes no place a client's request could have
   * (QUEUE_MAX, QUEUE_MAX_SECONDS), and counts in no client's fair share, no count of jobs (load()), no
   * wait time and no average. Queued as a keyless client's job, a preload's retry got a keyless request
   * refused with 429, and waited in that client's line ahead of its requests. A worker is free only while
   * no waiting job may start (dispatch starts those first), so upkeep never delays a client's job that
   * could run: it takes a worker that would have been idle.
   */
  runIfIdle<T>(job: () => Promise<T>): Promise<T> | undefined {
    if (this.closed || this.busy() >= this.concurrency) return undefined;
    this.upkeep++;
    // async: a job that throws at once still gives its worker back.
    return (async () => job())().finally(() => {
      this.upkeep--;
      this.dispatch();
    });
  }

  /** Jobs holding a worker: the clients' and the upkeep's. */
  private busy(): number {
    return this.running.size + this.upkeep;
  }

  /** How many jobs may run at once from now on; more waiting jobs start at once if it grew. */
  setConcurrency(concurrency: number): void {
    this.concurrency = concurrency;
    this.dispatch();
  }

  private dispatch(): void {
    while (this.busy() < this.concurrency) {
      const entry = this.order.next((client) => this.mayStart(client, this.limitsOf(client)));
      if (!entry) return;
      entry.start();
    }
  }

  /** Whether `client` runs fewer jobs than its `maxConcurrent` allows, so one more of its jobs may start. */
  private mayStart(client: string, limits: ClientLimits): boolean {
    return (this.runningByClient.get(client) ?? 0) < (limits.maxConcurrent ?? Infinity);
  }

  private limitsOf(client: string): ClientLimits {
    return this.order.peek(client)?.ticket.limits ?? {};
  }

  private began(entry: Entry): void {
    const charged = entry.shares();
    for (const [client, work] of charged) this.order.charge(client, work);
    this.running.set(entry, { charged, startedAt: performance.now(), done: 0 });
    this.runningByClient.set(entry.ticket.client, (this.runningByClient.get(entry.ticket.client) ?? 0) + 1);
  }

  private ended(entry: Entry): void {
    this.running.delete(entry);
    const left = (this.runningByClient.get(entry.ticket.client) ?? 1) - 1;
    if (left > 0) this.runningByClient.set(entry.ticket.client, left);
    else this.runningByClient.delete(entry.ticket.client);
  }

  /** Why a new request may not wait, or undefined when it may; `waiting`: it waits whatever workers are free (see waitOutside). */
  private refusal(ticket: Ticket, waiting = false): QueueFullError | undefined {
    // A worker is free, and this client may use it: it starts at once (the jobs waiting now are held by
    // their own clients' limits, or dispatch would have started them), whatever waits.
    if (!waiting && this.busy() < this.concurrency && this.mayStart(ticket.client, ticket.limits)) return undefined;
    const work = [...[...this.order.entries()].map((entry) => ({ client: entry.ticket.client, cost: entry.cost() })), ...this.outside];
    const jobs = work.map(({ client }) => ({ client, cost: 1 }));
    const maxWork = (this.options.maxQueuedSeconds ?? Infinity) * Math.max(1, this.concurrency);
    const full = jobs.length >= this.maxWaiting && !floodedBy(ticket.client, jobs, this.maxWaiting);
    const tooMuchWork = total(work) > maxWork && !floodedBy(ticket.client, work, maxWork);
    if (full || tooMuchWork) return new QueueFullError(this.retryAfterSeconds(), full ? 'QUEUE_MAX' : 'QUEUE_MAX_SECONDS');
    return undefined;
  }

  private sum(entries: Iterable<Entry>): number {
    let total = 0;
    for (const entry of entries) total += entry.cost();
    return total;
  }

  /** The error of a job of `ticket` that waited since `queued` too long. */
  private timedOut(queued: number, waitedBefore: number, ticket: Ticket): QueueTimeoutError {
    this.options.onWaited?.(performance.now() - queued);
    const waited = Math.round((performance.now() - queued + waitedBefore) / 1000);
    // With no worker to run anything, the work ahead says nothing of when one will be back.
    if (this.concurrency === 0) return new QueueTimeoutError(waited, NO_WORKER_RETRY_SECONDS, true);
    const { maxConcurrent } = ticket.limits;
    const heldByOwnLimit = !this.mayStart(ticket.client, ticket.limits);
    // Retried, it waits in its client's line again, which the fair order takes in turn with the others:
    // what holds it is the running jobs (its own client's, where its limit held it), not the whole queue
    // (the oldest request, the first to time out, was told to wait longest).
    const holding = [...this.running].filter(([entry]) => !heldByOwnLimit || entry.ticket.client === ticket.client);
    return new QueueTimeoutError(waited, firstToEnd(holding), false, heldByOwnLimit ? maxConcurrent : undefined);
  }

  /**
   * When the work ahead of a newcomer (what is left of the running jobs, and the waiting ones, shared
   * among the workers) should be done. Estimates are asked again: they improve as jobs progress. It is
   * never more than `maxWaitMs`: by then each request waiting now has started or given up, so there is
   * room whatever the estimates say (a model not timed yet is a guess, off by ten times either way).
   */
  private retryAfterSeconds(): number {
    const now = performance.now();
    let left = 0;
    for (const [entry, run] of this.running) left += secondsLeft(entry, run, now);
    const ahead = (left + this.sum(this.order.entries())) / Math.max(1, this.concurrency);
    const longest = this.options.maxWaitMs === undefined ? Infinity : this.options.maxWaitMs / 1000;
    return Math.max(1, Math.ceil(Math.min(ahead, longest)));
  }

  /** The clients' jobs running and waiting (not the upkeep's: see runIfIdle). */
  load(): { running: number; queued: number } {
    return { running: this.running.size, queued: this.order.size };
  }

  /**
   * Why `client` would be refused now whatever it asked for (the queue is closed, full, or holds too
   * much work), or undefined: what a request of no cost would hear, checked before reading a large
   * upload that would only be refused.
   */
  wouldRefuse(client = ANONYMOUS_CLIENT, limits: ClientLimits = {}): QueueFullError | QueueClosedError | undefined {
    return this.closed ? new QueueClosedError() : this.refusal(new Ticket(client, 0, limits));
  }

  /**
   * Holds a place for a request that waits outside the queue for what it needs before its jobs may
   * queue (its API key's `concurrent` slot over all servers, key-slots.ts): it counts as waiting work
   * of its client (QUEUE_MAX, QUEUE_MAX_SECONDS, the flood rule), so that waiting there loosens no
   * bound, and is refused (thrown) as it would be were it queued. Returns what gives the place up,
   * which the request calls once its wait ends, before its jobs queue. Let in, it is admitted: its jobs
   * then queue in the place it held. Weighed again then, one that waited for its key's slot was refused
   * (429) as its slot came, behind the newcomers the flood rule had let in beside it while it waited.
   */
  waitOutside(ticket: Ticket): () => void {
    const refusal = this.closed ? new QueueClosedError() : this.refusal(ticket, true);
    if (refusal) throw refusal;
    ticket.admitted = true;
    this.outside.add(ticket);
    return () => void this.outside.delete(ticket);
  }

  /** Rejects the waiting jobs with QueueClosedError and refuses new ones; running jobs go on. */
  close(): void {
    this.closed = true;
    for (const entry of [...this.order.entries()]) entry.cancel(new QueueClosedError());
  }
}
