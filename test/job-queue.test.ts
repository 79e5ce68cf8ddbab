import { describe, expect, it } from 'vitest';
import { JobQueue, QueueClosedError, QueueFullError, QueueTimeoutError, Ticket, type RunningJob } from '../src/engine/job-queue.js';

/** The engine's admission control: bounded waiting, cancellation of waiting jobs only. */

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

describe('JobQueue', () => {
  it('runs at most `concurrency` jobs and refuses beyond `maxWaiting` with a retry hint', async () => {
    const queue = new JobQueue(2, 1);
    const g = gate();
    const started: number[] = [];
    const job = (i: number) => () => {
      started.push(i);
      return g.opened.then(() => i);
    };
    const runs = [queue.run(job(1)), queue.run(job(2)), queue.run(job(3))];
    expect(started).toEqual([1, 2]);
    expect(queue.load()).toEqual({ running: 2, queued: 1 });
    const full = await queue.run(job(4)).catch((e: unknown) => e);
    expect(full).toBeInstanceOf(QueueFullError);
    expect((full as QueueFullError).retryAfterSeconds).toBeGreaterThanOrEqual(1);
    // Which setting refused it, for the log: OpenAI's 429 code is the same for every limit.
    expect((full as QueueFullError).limit).toBe('QUEUE_MAX');
    g.open();
    expect(await Promise.all(runs)).toEqual([1, 2, 3]);
    expect(queue.load()).toEqual({ running: 0, queued: 0 });
  });

  it('tells a refused client to retry when a job past its estimate should end by its progress, not in 1 s again and again', async () => {
    const queue = new JobQueue(1, 0);
    const g = gate();
    let running!: RunningJob;
    const run = queue.run(
      (job) => {
        running = job;
        return g.opened;
      },
      undefined,
      { cost: () => 0.01 },
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    const refusal = async () => ((await queue.run(async () => undefined).catch((err: unknown) => err)) as QueueFullError).retryAfterSeconds;
    // Past its estimate, nothing heard of its progress: it may end any moment.
    expect(await refusal()).toBe(1);
    // A fiftieth done in 0.3 s: about 15 s to go.
    running.progress(0.02);
    expect(await refusal()).toBeGreaterThanOrEqual(10);
    g.open();
    await run;
  });

  it("counts requests waiting outside it (for a key's slot over all servers) as waiting, whatever workers are free", async () => {
    const queue = new JobQueue(2, 2);
    const [a, b, c] = ['alice', 'alice', 'alice'].map((client) => new Ticket(client, 1));
    // Both workers free, yet a place outside is a place in the waiting room: two fill it.
    const leaves = [queue.waitOutside(a), queue.waitOutside(b)];
    expect(() => queue.waitOutside(c)).toThrow(QueueFullError);
    expect(queue.wouldRefuse('alice')).toBeUndefined();
    // Another client is let in past the flood, as into the queue itself.
    const leaveBob = queue.waitOutside(new Ticket('bob', 1));
    // Places given up (their slots came) are free again.
    leaves[0]();
    leaveBob();
    expect(() => queue.waitOutside(c)).not.toThrow();
    leaves[1]();
    queue.close();
    expect(() => queue.waitOutside(new Ticket('carol', 1))).toThrow(QueueClosedError);
  });

  it('queues the jobs of a request let in to wait outside without weighing it again: it held its place', async () => {
    const queue = new JobQueue(1, 2);
    const g = gate();
    const running = queue.run(() => g.opened);
    // Two of alice's requests wait for her key's slot, and bob's job, with nothing of his waiting, is let in past them.
    const [first, second] = [new Ticket('alice', 1), new Ticket('alice', 1)];
    const places = [queue.waitOutside(first), queue.waitOutside(second)];
    const bob = queue.run(async () => 'bob', undefined, { ticket: new Ticket('bob', 1) });
    // Her slot comes: her first request's job queues where it waited, though bob's and her second fill the room.
    places[0]();
    const hers = queue.run(async () => 'alice', undefined, { ticket: first });
    // A new request of hers is still refused.
    await expect(queue.run(async () => 'no', undefined, { ticket: new Ticket('alice', 1) })).rejects.toBeInstanceOf(QueueFullError);
    places[1]();
    g.open();
    expect(await Promise.all([running, bob, hers])).toEqual([undefined, 'bob', 'alice']);
  });

  it("bounds a request's first wait as a whole: what it waited outside the queue (for its answer's room, its key's slot) counts", async () => {
    const queue = new JobQueue(1, 4, { maxWaitMs: 1200 });
    const g = gate();
    const running = queue.run(() => g.opened);
    const ticket = new Ticket('alice', 1);
    const leave = queue.waitOutside(ticket);
    ticket.waited();
    await new Promise((resolve) => setTimeout(resolve, 800));
    leave();
    const queued = performance.now();
    const late = await queue.run(async () => 'never', undefined, { ticket }).catch((err: unknown) => err);
    // About 400 ms in the queue: 1200 in all. Before, the queue's own 1200 began as it queued.
    expect(late).toBeInstanceOf(QueueTimeoutError);
    expect(performance.now() - queued).toBeLessThan(1000);
    expect((late as QueueTimeoutError).waitedSeconds).toBe(1);
    g.open();
    await running;
  });

  it('drops a waiting job when its signal aborts, but lets a running one finish', async () => {
    const queue = new JobQueue(1, 4);
    const g = gate();
    const ran: string[] = [];
    const running = new AbortController();
    const waiting = new AbortController();
    const first = queue.run(() => (ran.push('first'), g.opened.then(() => 'first done')), running.signal);
    const second = queue.run(async () => void ran.push('second'), waiting.signal);
    waiting.abort(new Error('client left'));
    await expect(second).rejects.toThrow('client left');
    running.abort(new Error('too late'));
    g.open();
    expect(await first).toBe('first done');
    expect(ran).toEqual(['first']);
    await expect(queue.run(async () => 1, AbortSignal.abort(new Error('already gone')))).rejects.toThrow('already gone');
  });

  it("runs the workers' upkeep only on a free worker, holding it as a job does, as no client's work", async () => {
    const waited: number[] = [];
    const queue = new JobQueue(1, 1, { onWaited: (ms) => void waited.push(ms) });
    const client = gate();
    const running = queue.run(() => client.opened);
    // The only worker is a client's: the upkeep does not start, nor wait in a keyless client's place.
    expect(queue.runIfIdle(async () => 'upkeep')).toBeUndefined();
    expect(queue.load()).toEqual({ running: 1, queued: 0 });
    expect(queue.wouldRefuse()).toBeUndefined();
    client.open();
    await running;
    await expect.poll(() => queue.load().running).toBe(0);

    const upkeep = gate();
    const ran: string[] = [];
    const done = queue.runIfIdle(() => upkeep.opened.then(() => 'upkeep done'));
    expect(done).toBeDefined();
    // It holds the worker: a client's job waits for it, but it is in no count of jobs.
    const next = queue.run(async () => void ran.push('client'));
    expect(queue.load()).toEqual({ running: 0, queued: 1 });
    expect(queue.runIfIdle(async () => 'another')).toBeUndefined();
    upkeep.open();
    expect(await done).toBe('upkeep done');
    await next;
    expect(ran).toEqual(['client']);
    // The clients' two jobs waited; the upkeep never did.
    expect(waited).toHaveLength(2);
    // One that fails at once gives the worker back.
    await expect(
      queue.runIfIdle(() => {
        throw new Error('failed at once');
      }),
    ).rejects.toThrow('failed at once');
    expect(await queue.run(async () => 'served')).toBe('served');
  });

  it('on close rejects waiting jobs and new ones, and lets running ones finish', async () => {
    const queue = new JobQueue(1, 4);
    const g = gate();
    const first = queue.run(() => g.opened.then(() => 'done'));
    const second = queue.run(async () => 'never');
    queue.close();
    await expect(second).rejects.toBeInstanceOf(QueueClosedError);
    await expect(queue.run(async () => 'late')).rejects.toBeInstanceOf(QueueClosedError);
    g.open();
    expect(await first).toBe('done');
  });
});
