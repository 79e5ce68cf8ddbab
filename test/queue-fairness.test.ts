import { describe, expect, it, vi } from 'vitest';
import { JobQueue, QueueFullError, QueueTimeoutError, RequeueError, Ticket, type JobQueueOptions, type RunningJob } from '../src/engine/job-queue.js';

/**
 * The queue weighs work, not jobs: clients are served fairly by estimated seconds, a request's own
 * batches never time out behind each other, Retry-After follows the work ahead, per-client limits
 * hold, and a job that never reached its worker waits again instead of failing.
 */

/** A job that runs until released, recording when it started. */
function controlled(log: string[], name: string) {
  let release!: () => void;
  const done = new Promise<void>((resolve) => (release = resolve));
  return { job: () => (log.push(name), done.then(() => name)), release: () => release() };
}

const cost = (seconds: number) => () => seconds;

/** `count` controlled jobs (`<name>0`, `<name>1`, ...) of a client, each estimated at `seconds`, all sent at once. */
function burst(queue: JobQueue, log: string[], { name, client = name, count, seconds = 1, maxConcurrent }: { name: string; client?: string; count: number; seconds?: number; maxConcurrent?: number }) {
  const jobs = Array.from({ length: count }, (_, i) => controlled(log, `${name}${i}`));
  const ticket = () => new Ticket(client, seconds, maxConcurrent === undefined ? undefined : { maxConcurrent });
  const runs = jobs.map((j) => queue.run(j.job, undefined, { ticket: ticket(), cost: cost(seconds) }));
  return { jobs, runs };
}

/** Three controlled jobs (`<client>0`..`<client>2`) of a client allowed one running job at a time. */
const oneAtATime = (queue: JobQueue, log: string[], client: string) => burst(queue, log, { name: client, count: 3, maxConcurrent: 1 });
const tick = () => new Promise((resolve) => setImmediate(resolve));

describe('fair order across clients', () => {
  it("starts another client's cheap job after at most one of a flooding client's expensive ones", async () => {
    const queue = new JobQueue(1, 100);
    const log: string[] = [];
    const { jobs: flood, runs: floodDone } = burst(queue, log, { name: 'A', count: 10, seconds: 50 });
    expect(log).toEqual(['A0']);

    // B sends cheap requests one after the other, each when its previous one finished.
    for (let i = 0; i < 3; i++) {
      const cheap = controlled(log, `B${i}`);
      const answer = queue.run(cheap.job, undefined, { ticket: new Ticket('B', 1), cost: cost(1) });
      const runningA = flood.find((_, k) => log.at(-1) === `A${k}`);
      runningA?.release();
      await tick();
      expect(log.at(-1)).toBe(`B${i}`);
      cheap.release();
      await answer;
      await tick();
    }
    // Only the A job running when each B arrived went before it: B never waited for the flood.
    expect(log.filter((name) => name.startsWith('A')).length).toBeLessThanOrEqual(4);
    for (const f of flood) f.release();
    await Promise.all(floodDone);
  });

  it('holds a client to its maxConcurrent while other clients take the free workers', async () => {
    const queue = new JobQueue(3, 100);
    const log: string[] = [];
    const { jobs, runs } = oneAtATime(queue, log, 'A');
    const other = controlled(log, 'B0');
    const b = queue.run(other.job, undefined, { ticket: new Ticket('B', 1), cost: cost(1) });
    expect(log).toEqual(['A0', 'B0']);
    jobs[0].release();
    await tick();
    expect(log).toEqual(['A0', 'B0', 'A1']);
    for (const j of [...jobs, other]) j.release();
    await Promise.all([...runs, b]);
  });
});

describe("a request's own batches", () => {
  it('never time out behind each other: the time limit is on the first batch starting', async () => {
    vi.useFakeTimers();
    try {
      const queue = new JobQueue(1, 100, { maxWaitMs: 1000 });
      const ticket = new Ticket('A', 30);
      const batch = (ms: number) => () => new Promise<number>((resolve) => setTimeout(() => resolve(ms), ms));
      const parts = [queue.run(batch(5000), undefined, { ticket }), queue.run(batch(5000), undefined, { ticket }), queue.run(batch(5000), undefined, { ticket })];
      const settled = Promise.allSettled(parts);
      await vi.advanceTimersByTimeAsync(15_000);
      expect((await settled).map((r) => r.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled']);
    } finally {
      vi.useRealTimers();
    }
  });

  it('are admitted together: a request past QUEUE_MAX is refused whole, one admitted is never refused halfway', async () => {
    const queue = new JobQueue(1, 1);
    const log: string[] = [];
    const blocker = controlled(log, 'X');
    const x = queue.run(blocker.job);
    const ticket = new Ticket('A', 3);
    const parts = [1, 2, 3].map((i) => queue.run(async () => i, undefined, { ticket }));
    // A's own (another client's would be let in beside A's batches, as beside any flood).
    await expect(queue.run(async () => 'late', undefined, { ticket: new Ticket('A', 1) })).rejects.toBeInstanceOf(QueueFullError);
    blocker.release();
    expect(await Promise.all([x, ...parts])).toEqual(['X', 1, 2, 3]);
  });

  it("a later request's first batch still times out while the queue is busy", async () => {
    vi.useFakeTimers();
    try {
      const queue = new JobQueue(1, 100, { maxWaitMs: 1000 });
      const long = queue.run(() => new Promise<void>((resolve) => setTimeout(resolve, 5000)));
      const late = queue.run(async () => 'never', undefined, { ticket: new Ticket('B', 1) }).catch((e: unknown) => e);
      await vi.advanceTimersByTimeAsync(1000);
      expect(await late).toBeInstanceOf(QueueTimeoutError);
      await vi.advanceTimersByTimeAsync(4000);
      await long;
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('Retry-After', () => {
  async function refusedAfter(queuedCost: number, options: JobQueueOptions = {}): Promise<number> {
    const queue = new JobQueue(1, 1, options);
    const log: string[] = [];
    const running = controlled(log, 'run');
    const first = queue.run(running.job, undefined, { ticket: new Ticket('A', 10), cost: cost(10) });
    const waiting = queue.run(async () => 'wait', undefined, { ticket: new Ticket('A', queuedCost), cost: cost(queuedCost) });
    // The waiting job's own client: another client with nothing waiting would be let in beside it.
    const err = (await queue.run(async () => 'no', undefined, { ticket: new Ticket('A', 1), cost: cost(1) }).catch((e: unknown) => e)) as QueueFullError;
    expect(err).toBeInstanceOf(QueueFullError);
    running.release();
    await Promise.all([first, waiting]);
    return err.retryAfterSeconds;
  }

  it('is the estimated seconds of the work ahead, larger with more queued cost', async () => {
    const little = await refusedAfter(5);
    const much = await refusedAfter(500);
    expect(little).toBe(15);
    expect(much).toBe(510);
  });

  it('is never more than maxWaitMs, by when each request waiting now has started or given up, however far off the estimates are', async () => {
    // A model not timed yet, or timed wrong, may be estimated at 500 s a batch: the queue's own
    // deadline still says when there is room (a fresh server told a flood 888 s for 12 s of work).
    expect(await refusedAfter(500, { maxWaitMs: 120_000 })).toBe(120);
    expect(await refusedAfter(5, { maxWaitMs: 120_000 })).toBe(15);
  });

  it('refuses new requests once the queued work passes maxQueuedSeconds per worker', async () => {
    const queue = new JobQueue(2, 100, { maxQueuedSeconds: 60 });
    const log: string[] = [];
    const { jobs, runs } = burst(queue, log, { name: 'J', client: 'A', count: 4, seconds: 100 });
    // Two run, two wait: 200 s of work waiting for 2 workers, past 60 s each (A's own: B, with nothing
    // waiting, would be let in beside it).
    const err = (await queue.run(async () => 'no', undefined, { ticket: new Ticket('A', 1), cost: cost(1) }).catch((e: unknown) => e)) as QueueFullError;
    expect(err).toBeInstanceOf(QueueFullError);
    expect(err.retryAfterSeconds).toBe(200);
    // Room for 100 jobs: the work refused it, as the log says.
    expect(err.limit).toBe('QUEUE_MAX_SECONDS');
    for (const j of jobs) j.release();
    await Promise.all(runs);
  });
});

describe('a request that timed out, or finds a worker free', () => {
  it('is told to retry when the first running job should end, not after the whole queue; behind its own concurrent limit, it is told so', async () => {
    vi.useFakeTimers();
    try {
      const queue = new JobQueue(1, 100, { maxWaitMs: 1000 });
      const log: string[] = [];
      const running = controlled(log, 'run');
      void queue.run(running.job, undefined, { ticket: new Ticket('A', 30), cost: cost(30) });
      // Four waiting behind it, 100 s each: the oldest used to be told the most (the whole queue).
      const waiting = Array.from({ length: 4 }, (_, i) => queue.run(async () => i, undefined, { ticket: new Ticket(`C${i}`, 100), cost: cost(100) }).catch((e: unknown) => e));
      await vi.advanceTimersByTimeAsync(1000);
      const errors = (await Promise.all(waiting)) as QueueTimeoutError[];
      // The running job's 30 s less the second it ran.
      expect(errors.map((e) => [e.name, e.retryAfterSeconds, e.clientLimit])).toEqual(Array(4).fill(['QueueTimeoutError', 29, undefined]));
      running.release();

      // Two workers, one free: the key's own limit of one is what holds its second request.
      const limited = new JobQueue(2, 100, { maxWaitMs: 1000 });
      const own = controlled(log, 'own');
      void limited.run(own.job, undefined, { ticket: new Ticket('K', 5, { maxConcurrent: 1 }), cost: cost(5) });
      const second = limited.run(async () => 'no', undefined, { ticket: new Ticket('K', 5, { maxConcurrent: 1 }), cost: cost(5) }).catch((e: unknown) => e);
      await vi.advanceTimersByTimeAsync(1000);
      expect(await second).toMatchObject({ name: 'QueueTimeoutError', clientLimit: 1, retryAfterSeconds: 4 });
      own.release();
    } finally {
      vi.useRealTimers();
    }
  });

  it('is admitted when a worker is free for it, however many other clients\' jobs wait held by their own limits', async () => {
    // Room for two waiting jobs; one client with a limit of one fills it while a worker is idle.
    const queue = new JobQueue(2, 2);
    const log: string[] = [];
    const { jobs, runs } = oneAtATime(queue, log, 'K');
    expect(queue.load()).toEqual({ running: 1, queued: 2 });
    const other = controlled(log, 'B0');
    const b = queue.run(other.job, undefined, { ticket: new Ticket('B', 1), cost: cost(1) });
    expect(log).toEqual(['K0', 'B0']);
    // The limited client itself is still refused: nothing free for it, and no room to wait.
    await expect(queue.run(async () => 'no', undefined, { ticket: new Ticket('K', 1, { maxConcurrent: 1 }), cost: cost(1) })).rejects.toBeInstanceOf(QueueFullError);
    for (const j of [...jobs, other]) j.release();
    await Promise.all([...runs, b]);
  });
});

describe('a full waiting room', () => {
  it("admits a client with nothing waiting while another client's flood fills it, until the others fill it too, and goes on refusing the flood", async () => {
    const queue = new JobQueue(1, 4);
    const log: string[] = [];
    const { jobs: flood, runs } = burst(queue, log, { name: 'A', count: 5, seconds: 10 });
    expect(queue.load()).toEqual({ running: 1, queued: 4 });
    await expect(queue.run(async () => 'no', undefined, { ticket: new Ticket('A', 10), cost: cost(10) })).rejects.toBeInstanceOf(QueueFullError);
    // B, C, D have nothing waiting: each gets in while A holds more than half of what waits.
    const others = ['B', 'C', 'D'].map((client) => queue.run(async () => client, undefined, { ticket: new Ticket(client, 1), cost: cost(1) }));
    expect(queue.load()).toEqual({ running: 1, queued: 7 });
    // A holds 4 of 7, the others 3, less than the room: E gets in; after it the others fill a room of their own.
    const e = queue.run(async () => 'E', undefined, { ticket: new Ticket('E', 1), cost: cost(1) });
    expect(queue.load().queued).toBe(8);
    await expect(queue.run(async () => 'no', undefined, { ticket: new Ticket('F', 1), cost: cost(1) })).rejects.toBeInstanceOf(QueueFullError);
    // B again, with its first request still waiting: refused as before.
    await expect(queue.run(async () => 'no', undefined, { ticket: new Ticket('B', 1), cost: cost(1) })).rejects.toBeInstanceOf(QueueFullError);
    for (const f of flood) f.release();
    expect(await Promise.all([...others, e])).toEqual(['B', 'C', 'D', 'E']);
    await Promise.all(runs);
  });
});

describe('waiting work over maxQueuedSeconds', () => {
  it("admits a client with nothing waiting while another client's long jobs pass it, starts that client's job first, and goes on refusing the flood", async () => {
    const queue = new JobQueue(1, 100, { maxQueuedSeconds: 60 });
    const log: string[] = [];
    // One running job of A's and one waiting, of 500 s: one request can be many times the bound.
    const { jobs: flood, runs } = burst(queue, log, { name: 'A', count: 2, seconds: 500 });
    await expect(queue.run(async () => 'no', undefined, { ticket: new Ticket('A', 1), cost: cost(1) })).rejects.toBeInstanceOf(QueueFullError);
    const b = queue.run(async () => (log.push('B'), 'B'), undefined, { ticket: new Ticket('B', 50), cost: cost(50) });
    // B's 50 s waiting is its own: B again is refused, C (B's 50 s and C's own, under 60 s) is not, and D, after them, is.
    await expect(queue.run(async () => 'no', undefined, { ticket: new Ticket('B', 1), cost: cost(1) })).rejects.toBeInstanceOf(QueueFullError);
    const c = queue.run(async () => (log.push('C'), 'C'), undefined, { ticket: new Ticket('C', 20), cost: cost(20) });
    await expect(queue.run(async () => 'no', undefined, { ticket: new Ticket('D', 1), cost: cost(1) })).rejects.toBeInstanceOf(QueueFullError);
    for (const f of flood) f.release();
    expect(await Promise.all([b, c])).toEqual(['B', 'C']);
    await Promise.all(runs);
    expect(log).toEqual(['A0', 'B', 'C', 'A1']);
  });
});

describe('a job that never reached its worker', () => {
  it('waits again at the head of the line instead of failing, and still leaves when its client does', async () => {
    const queue = new JobQueue(1, 100);
    let attempts = 0;
    const flaky = async () => {
      attempts++;
      if (attempts === 1) throw new RequeueError(new Error('the worker was already dead'));
      return 'ran';
    };
    expect(await queue.run(flaky)).toBe('ran');
    expect(attempts).toBe(2);

    const client = new AbortController();
    const never = queue.run(
      async () => {
        client.abort(new Error('client left'));
        throw new RequeueError(new Error('the worker was already dead'));
      },
      client.signal,
    );
    await expect(never).rejects.toThrow('client left');
    expect(queue.load()).toEqual({ running: 0, queued: 0 });
  });

  it('counts a job that waits again and restarts before its first run is done as one running job, never two workers for one', async () => {
    const queue = new JobQueue(2, 100);
    let running = 0;
    let most = 0;
    const both = controlled([], 'both');
    const held = controlled([], 'held');
    /** A job that runs until `until` settles, counted while it runs. */
    const counted = <T>(until: () => Promise<T>) => () => {
      most = Math.max(most, ++running);
      return until().finally(() => running--);
    };
    // B ends just as A's worker turns out gone: B's end dispatches while A waits again but has not ended.
    const b = queue.run(counted(() => both.job()));
    let attempts = 0;
    const a = queue.run(() =>
      ++attempts === 1
        ? both.job().then(() => Promise.reject(new RequeueError(new Error('the worker was already dead'))))
        : counted(() => held.job())(),
    );
    const others = [1, 2].map((i) => queue.run(counted(() => held.job().then(() => i))));
    both.release();
    await tick();
    // A ran again, and one of the others: two at a time, the third waits.
    expect(attempts).toBe(2);
    expect(most).toBe(2);
    expect(queue.load()).toEqual({ running: 2, queued: 1 });
    held.release();
    await Promise.all([a, b, ...others]);
    expect(most).toBe(2);
    expect(queue.load()).toEqual({ running: 0, queued: 0 });
  });

  it('refunds its charge once: a share given back as a member left it is not refunded again when it waits again', async () => {
    const queue = new JobQueue(1, 100);
    const log: string[] = [];
    const job = (name: string, client: string, seconds: number, body?: (running: RunningJob) => void) => {
      const ticket = new Ticket(client, seconds);
      return queue.run(async (running) => (log.push(name), body?.(running), name), undefined, { ticket, cost: cost(seconds) });
    };
    const first = controlled(log, 'A1');
    const runs = [queue.run(first.job, undefined, { ticket: new Ticket('A', 5), cost: cost(5) })];
    runs.push(job('B1', 'B', 6));
    let attempts = 0;
    // A2 (10 s) starts, a member of it leaves (4 s given back), and its worker turns out gone: it waits again.
    runs.push(
      job('A2', 'A', 10, (running) => {
        if (++attempts > 1) return;
        running.refund('A', 4);
        throw new RequeueError(new Error('the worker was already dead'));
      }),
    );
    runs.push(job('A3', 'A', 1), job('B2', 'B', 7), job('B3', 'B', 1));
    first.release();
    await Promise.all(runs);
    // Charged A 5 + 10 (A2 that ran) = 15 before A3, B 6 + 7 = 13 before B3: B3 first. Refunded twice
    // (the 4 s and the whole 10 s), A stood at 11 and A3 went first.
    expect(log).toEqual(['A1', 'B1', 'A2', 'A2', 'B2', 'B3', 'A3']);
  });
});
