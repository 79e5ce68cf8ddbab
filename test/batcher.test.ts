import { describe, expect, it } from 'vitest';
import { BatchMerger, type CostEstimate } from '../src/engine/batcher.js';
import { JobQueue, QueueFullError, QueueTimeoutError, Ticket, type JobQueueOptions } from '../src/engine/job-queue.js';
import type { BatchEvent, BatchItem, GeneratedImage, GenerationBatch } from '../src/runtime/types.js';
import { WorkerRuntime } from '../src/pipelines/run.js';
import { referenceModel } from './helpers/reference.js';

/** This file's own worker runtime, in this process. */
const runtime = new WorkerRuntime();

/**
 * Compatible requests waiting together share one denoising loop. Real pipelines run the batches
 * (in-process instead of in a worker process, so the test can watch what each run received).
 */

function request(items: BatchItem[], overrides: Partial<GenerationBatch> = {}): GenerationBatch {
  return { modelDir: referenceModel('sd-turbo'), width: 128, height: 128, steps: 4, guidanceScale: 0, items, ...overrides };
}

const item = (prompt: string, seed: number): BatchItem => ({ prompt, negativePrompt: '', seed });

/** `onEvent` hears each run's events (its steps), as the worker's caller does. */
function harness(maxItems = 8, onEvent?: (event: BatchEvent) => void) {
  const runs: { items: number; seeds: number[]; stoppedEarly: boolean }[] = [];
  const queue = new JobQueue(1, 10);
  const merger = new BatchMerger(
    queue,
    async (batch, stop) => {
      const run = { items: batch.items.length, seeds: batch.items.map((i) => i.seed), stoppedEarly: false };
      runs.push(run);
      try {
        return await runtime.runBatch(batch, { shouldStop: () => stop.aborted, onEvent });
      } catch (err) {
        run.stoppedEarly = true;
        throw err;
      }
    },
    maxItems,
    // A second per image: the fair queue weighs clients by it.
    (batch) => batch.items.length,
  );
  return { runs, merger };
}

/**
 * A merger on one worker with the queue's `options`, whose batches all end (with blank images) once
 * `release` is called; `estimate`: what the queue weighs a batch at.
 */
function heldMerger(options: JobQueueOptions, estimate?: CostEstimate) {
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  const merger = new BatchMerger(
    new JobQueue(1, 10, options),
    async (batch) => {
      await held;
      return batch.items.map((i) => ({ data: new Uint8Array(), contentType: 'image/png', seed: i.seed }));
    },
    4,
    estimate,
  );
  return { merger, release };
}

describe('merging compatible requests', () => {
  it("joins another client's group only when it is that client's next: never one at the back of a flood", async () => {
    const { runs, merger } = harness(4);
    const from = (client: string, seed: number) => merger.generate(request([item('a red circle', seed)]), undefined, new Ticket(client));
    const running = from('flood', 100);
    // Nine more from the same client, while the worker is busy: groups of 4, 4 and 1, the last still open.
    const flood = Array.from({ length: 9 }, (_, i) => from('flood', i + 1));
    // The same settings from another client: not merged into the open group at the flood's back.
    const other = from('other', 50);
    await Promise.all([running, ...flood, other]);
    expect(runs.map((r) => r.seeds)).toEqual([[100], [50], [1, 2, 3, 4], [5, 6, 7, 8], [9]]);
  });

  it("merges another client's request into a group that is its owner's next; a client with a concurrency limit merges nothing", async () => {
    const { runs, merger } = harness(4);
    const from = (client: string, seed: number, limits = {}) => merger.generate(request([item('a red circle', seed)]), undefined, new Ticket(client, 0, limits));
    const running = from('a', 100);
    const waiting = [from('a', 1), from('b', 2), from('c', 3, { maxConcurrent: 1 }), from('c', 4, { maxConcurrent: 1 })];
    await Promise.all([running, ...waiting]);
    expect(runs.map((r) => r.seeds).sort()).toEqual([[1, 2], [100], [3], [4]]);
  });

  it("does not let a client's request join another client's group while an earlier one of its own waits: it would start ahead of it", async () => {
    const { runs, merger } = harness(4);
    const from = (client: string, seed: number, overrides: Partial<GenerationBatch> = {}) => merger.generate(request([item('a red circle', seed)], overrides), undefined, new Ticket(client));
    const running = from('a', 100);
    // b's first request has settings of its own; its second has a's group's, which is a's next.
    const waiting = [from('a', 1), from('b', 2, { steps: 2 }), from('b', 3)];
    await Promise.all([running, ...waiting]);
    const order = runs.map((r) => r.seeds);
    expect([...order].sort()).toEqual([[1], [100], [2], [3]]);
    expect(order.findIndex(([seed]) => seed === 2)).toBeLessThan(order.findIndex(([seed]) => seed === 3));
  });

  it("does not put a request in a group that waits for its owner's concurrency limit while a worker is free", async () => {
    const queue = new JobQueue(2, 10);
    const started: number[][] = [];
    const finish = new Map<number, () => void>();
    const merger = new BatchMerger(
      queue,
      async (batch) => {
        const seeds = batch.items.map((i) => i.seed);
        started.push(seeds);
        await new Promise<void>((resolve) => finish.set(seeds[0], resolve));
        return batch.items.map((i) => ({ data: new Uint8Array(), contentType: 'image/png', seed: i.seed }));
      },
      4,
    );
    const from = (client: string, seed: number, limits = {}) => merger.generate(request([item('a red circle', seed)]), undefined, new Ticket(client, 0, limits));
    // 'a' may run one batch at a time: its second waits for its first, while the other worker is idle.
    const running = from('a', 1, { maxConcurrent: 1 });
    const held = from('a', 2, { maxConcurrent: 1 });
    const other = from('b', 3);
    await expect.poll(() => started).toEqual([[1], [3]]);
    finish.get(3)!();
    await other;
    finish.get(1)!();
    await running;
    await expect.poll(() => started).toEqual([[1], [3], [2]]);
    finish.get(2)!();
    await held;
  });

  it("bounds the wait of a request in another request's group by the queue's time limit, though that request had started", async () => {
    // The group's place in the queue is its owner's request, whose wait is unbounded once it started
    // (its first batch runs): the request that joined it must still give up at the limit.
    const { merger, release } = heldMerger({ maxWaitMs: 200 });
    const owner = new Ticket('a');
    const first = merger.generate(request([item('a red circle', 1)]), undefined, owner);
    await expect.poll(() => owner.started).toBe(true);
    const second = merger.generate(request([item('a red circle', 2)]), undefined, owner);
    const joiner = merger.generate(request([item('a red circle', 3)]), undefined, new Ticket('b'));
    await expect(joiner).rejects.toBeInstanceOf(QueueTimeoutError);
    release();
    expect((await second).map((image) => image.seed)).toEqual([2]);
    expect((await first).map((image) => image.seed)).toEqual([1]);
  });

  it("keeps a request that joined another request's group waiting for its own time limit when that request's runs out", async () => {
    const limitMs = 600;
    const { merger, release } = heldMerger({ maxWaitMs: limitMs });
    const busy = merger.generate(request([item('a red circle', 1)], { steps: 1 }), undefined, new Ticket('a'));
    const owner = merger.generate(request([item('a red circle', 2)]), undefined, new Ticket('a'));
    const ownerGaveUp = owner.catch((err: unknown) => err);
    // Half the limit later, another client's request joins the owner's group (its owner's next to start).
    await new Promise((resolve) => setTimeout(resolve, limitMs / 2));
    const joiner = merger.generate(request([item('a red circle', 3)]), undefined, new Ticket('b'));
    expect(await ownerGaveUp).toBeInstanceOf(QueueTimeoutError);
    // The worker frees before the joiner's own limit: its image is made. Before, the owner's timeout
    // dropped the whole group, and the joiner got a 503 saying it had waited the limit after half of it.
    setTimeout(release, limitMs / 4);
    await busy;
    expect((await joiner).map((image) => image.seed)).toEqual([3]);
  });

  it('admits a request that would join a waiting group as it would admit it alone: past QUEUE_MAX_SECONDS it is refused', async () => {
    // A second an image; 3 s of work may wait. A request let in waits 2 s at most: one let in by mistake fails the test then.
    const { merger, release } = heldMerger({ maxQueuedSeconds: 3, maxWaitMs: 2000 }, (batch) => batch.items.length);
    const from = (client: string, seeds: number[], overrides: Partial<GenerationBatch> = {}) =>
      merger.generate(request(seeds.map((seed) => item('a red circle', seed)), overrides), undefined, new Ticket(client, seeds.length));
    const busy = from('a', [1], { steps: 1 });
    // 4 s wait, a's and b's alike, over the bound: a newcomer is refused (neither holds more than half).
    const admitted = [from('a', [2, 3]), from('b', [4, 5], { steps: 2 })];
    await expect(from('c', [6], { steps: 3 })).rejects.toBeInstanceOf(QueueFullError);
    // The same request in the settings of a's waiting group, a's next, which it would join; and a's own
    // further request, which would join its group. Before, both were let in to wait without a look at
    // the queue (the group had room: 4 images), and the work waiting grew past the bound unrefused.
    await expect(from('c', [7])).rejects.toBeInstanceOf(QueueFullError);
    await expect(from('a', [8])).rejects.toBeInstanceOf(QueueFullError);
    release();
    expect((await Promise.all([busy, ...admitted])).map((images) => images.map((image) => image.seed))).toEqual([[1], [2, 3], [4, 5]]);
  });

  it('runs requests that waited together as one batch, each getting its own images', async () => {
    const { runs, merger } = harness();
    const first = merger.generate(request([item('a red circle', 1)]));
    // These arrive while the only worker is busy: three compatible ones and one of another size.
    const merged = [
      merger.generate(request([item('a blue square', 2), item('a blue square', 3)])),
      merger.generate(request([item('a green triangle', 4)])),
      merger.generate(request([item('a yellow circle', 5)])),
    ];
    const other = merger.generate(request([item('a red square', 6)], { width: 256, height: 256 }));
    const results = await Promise.all([first, ...merged, other]);

    expect(runs.map((r) => r.items)).toEqual([1, 4, 1]);
    expect(results.map((r) => r.map((img) => img.seed))).toEqual([[1], [2, 3], [4], [5], [6]]);
    // Each image is the one its seed gives alone.
    const [alone] = await runtime.runBatch(request([item('a green triangle', 4)]));
    expect(Buffer.compare(Buffer.from(alone.data), Buffer.from(results[2][0].data))).toBe(0);
  });

  it('shares one loop between requests that differ only in file format, encoding each as it asked', async () => {
    const { runs, merger } = harness();
    const first = merger.generate(request([item('a red circle', 1)]));
    const png = merger.generate(request([item('a blue square', 2)]));
    const webp = merger.generate(request([{ ...item('a blue square', 3), output: { format: 'webp', compression: 50 } }]));
    const jpeg = merger.generate(request([{ ...item('a blue square', 4), output: { format: 'jpeg' } }]));
    const [, [p], [w], [j]] = await Promise.all([first, png, webp, jpeg]);
    expect(runs.map((r) => r.items)).toEqual([1, 3]);
    expect([p.contentType, w.contentType, j.contentType]).toEqual(['image/png', 'image/webp', 'image/jpeg']);
    expect([...p.data.subarray(1, 4), ...w.data.subarray(8, 12)].map((b) => String.fromCharCode(b)).join('')).toBe('PNGWEBP');
  });

  it('never merges past the item limit', async () => {
    const { runs, merger } = harness();
    const items = (n: number, from: number) => Array.from({ length: n }, (_, i) => item('a red circle', from + i));
    await Promise.all([merger.generate(request(items(1, 0))), merger.generate(request(items(5, 10))), merger.generate(request(items(5, 20)))]);
    expect(runs.map((r) => r.items)).toEqual([1, 5, 5]);
  });

  it('drops a request whose client left before its batch started', async () => {
    const { runs, merger } = harness();
    const busy = merger.generate(request([item('a red circle', 1)]));
    const leaving = new AbortController();
    const left = merger.generate(request([item('a blue square', 2)]), leaving.signal);
    const stays = merger.generate(request([item('a green triangle', 3)]));
    leaving.abort(new Error('client went away'));
    await expect(left).rejects.toThrow('client went away');
    const [, kept] = await Promise.all([busy, stays]);
    expect(kept.map((img: GeneratedImage) => img.seed)).toEqual([3]);
    expect(runs.map((r) => r.items)).toEqual([1, 1]);
  });

  it("never puts a request in a group every client of which has left: it would fail with their reason", async () => {
    const { runs, merger } = harness(4);
    const busy = merger.generate(request([item('a red circle', 1)], { steps: 1 }), undefined, new Ticket('a'));
    const leaving = new AbortController();
    const left = merger.generate(request([item('a red circle', 2)]), leaving.signal, new Ticket('a'));
    leaving.abort(new Error("client a went away"));
    // In the same turn, before the abandoned group's place in the queue is given up: another client's
    // request of the same settings. Before, it joined that group and failed with "client a went away".
    const other = merger.generate(request([item('a red circle', 3)]), undefined, new Ticket('b'));
    await expect(left).rejects.toThrow('client a went away');
    await busy;
    expect((await other).map((image) => image.seed)).toEqual([3]);
    expect(runs.map((r) => r.seeds)).toEqual([[1], [3]]);
  });

  it('stops a running batch at its next step once every client left', async () => {
    const leaving = new AbortController();
    // Left at the batch's first step: not after a guessed time (on a busy machine it may not have
    // started), nor at a poll's look once it runs (the batch's start and 400 steps take about 0.25 s
    // here: a machine five times faster would be done by the poll's second look, never stopped early).
    const { runs, merger } = harness(8, (event) => {
      if (event.type === 'step') leaving.abort(new Error('client went away'));
    });
    const running = merger.generate(request([item('a red circle', 1)], { steps: 400, width: 256, height: 256 }), leaving.signal);
    await expect(running).rejects.toThrow('client went away');
    // The worker is free again: the next request runs.
    const next = await merger.generate(request([item('a blue square', 2)]));
    expect(next).toHaveLength(1);
    await expect.poll(() => runs[0].stoppedEarly).toBe(true);
  });
});

describe('merging within the model batch limit', () => {
  it("never puts more images in one batch than the model's maxBatch", async () => {
    const { runs, merger } = harness();
    const limited = (seed: number) => request([item('a red circle', seed)], { maxBatch: 2 });
    await Promise.all([1, 2, 3, 4, 5, 6].map((seed) => merger.generate(limited(seed))));
    // The first runs alone (the worker was free); the five that waited go in batches of at most 2.
    expect(runs.map((r) => r.items)).toEqual([1, 2, 2, 1]);
  });
});

describe('a client leaving a running merged batch, others staying', () => {
  /**
   * Four images of 1024x2048 run in two parts of two (a part holds at most 4 megapixels of images): the
   * last two, one client's, leave at the step `leaveAt` picks. Answers the images and the steps heard.
   */
  async function leaving(leaveAt: (step: number, total: number) => boolean) {
    const gone = new Set<number>();
    const steps: number[] = [];
    const previewed: number[] = [];
    const batch = request([item('a red circle', 1), item('a blue square', 2), item('a green triangle', 3), item('a red square', 4)].map((i) => ({ ...i, partialImages: 1 })), {
      width: 1024,
      height: 2048,
      steps: 8,
    });
    const images = await runtime.runMerged(batch, (i) => gone.has(i), {
      onEvent(event) {
        if (event.type === 'preview') return void previewed.push(event.item);
        steps.push(event.step);
        if (leaveAt(event.step, event.total)) [2, 3].forEach((i) => gone.add(i));
      },
    });
    return { images, steps, previewed, batch };
  }

  it('does not run a part of the batch all of whose clients left, makes them no preview or image, and still ends its steps at its total', async () => {
    const { images, steps, previewed, batch } = await leaving((step) => step === 1);
    expect(images.map((image) => image !== undefined)).toEqual([true, true, false, false]);
    // The first part's steps, then the second part's counted as done at once.
    expect(steps).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 16]);
    expect(previewed).toEqual([0, 1]);
    // The images that stay are those their seeds make alone.
    const [alone] = await runtime.runBatch({ ...batch, items: [batch.items[1]] });
    expect(Buffer.compare(Buffer.from(alone.data), Buffer.from(images[1]!.data))).toBe(0);
  });

  it('stops a part at its next step once all its clients left', async () => {
    const { images, steps } = await leaving((step, total) => step === total / 2 + 1);
    expect(images.map((image) => image !== undefined)).toEqual([true, true, false, false]);
    expect(steps).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 16]);
  });

  it("decodes no picture for an item whose client left by the time its turn came", async () => {
    const batch = request([item('a red circle', 1), item('a blue square', 2)]);
    const pipeline = await runtime.getPipeline(batch.modelDir);
    const pictures = await pipeline.generate(batch, { wanted: (i) => i === 0 });
    expect(pictures.map((picture) => picture?.width)).toEqual([128, undefined]);
  });
});

describe("a request's batches running at once, cancelled", () => {
  it('gives its client back the share of each of them, not of the first one twice', async () => {
    // Two workers; batches estimated at 10 s an image.
    const queue = new JobQueue(2, 10);
    const started: string[] = [];
    const finish = new Map<string, () => void>();
    const merger = new BatchMerger(
      queue,
      async (batch, stop) => {
        const name = batch.items[0].prompt;
        started.push(name);
        await new Promise<void>((resolve, reject) => {
          finish.set(name, resolve);
          stop.addEventListener('abort', () => reject(new Error('stopped')), { once: true });
        });
        return batch.items.map((i) => ({ data: new Uint8Array(), contentType: 'image/png', seed: i.seed }));
      },
      4,
      (batch) => 10 * batch.items.length,
    );
    // Each its own steps: no two merge.
    let steps = 1;
    const from = (client: string, prompt: string, images = 1, signal?: AbortSignal, ticket = new Ticket(client)) =>
      merger.generate(request(Array.from({ length: images }, (_, i) => item(prompt, i)), { steps: steps++ }), signal, ticket);
    // A's request of five images runs as two batches (1 and 4 images: 10 s and 40 s charged), one on each worker.
    const cancel = new AbortController();
    const ticket = new Ticket('A');
    const cancelled = [from('A', 'A cancelled', 1, cancel.signal, ticket), from('A', 'A cancelled', 4, cancel.signal, ticket)].map((p) => p.catch(() => 'cancelled'));
    await expect.poll(() => started.length).toBe(2);
    const waiting = [from('B', 'B1'), from('B', 'B2'), from('B', 'B3'), from('A', 'A next')];
    cancel.abort(new Error('client left'));
    expect(await Promise.all(cancelled)).toEqual(['cancelled', 'cancelled']);
    // Each batch let go in the order they started, two at a time.
    for (let next = 2; next < 6; next++) {
      await expect.poll(() => started.length).toBeGreaterThan(next);
      finish.get(started[next])!();
    }
    await Promise.all(waiting);
    // A was given back all 50 s, and its next request goes first. Given back only the first batch's 10 s,
    // twice (the second's refund sought in the first's charge, both being its request's), it went after all of B's.
    expect(started.slice(2)).toEqual(['A next', 'B1', 'B2', 'B3']);
  });
});

describe('a client leaving a running merged batch part-way', () => {
  it('is given back the share of the steps still to come, not its whole share', async () => {
    // One worker; batches estimated at 10 s an image. Each run waits for the test to let it end.
    const started: string[] = [];
    const finish = new Map<string, () => void>();
    const merger = new BatchMerger(
      new JobQueue(1, 10),
      async (batch, _stop, onEvent) => {
        const name = batch.items[0].prompt;
        started.push(name);
        // The merged batch is heard half done as it starts.
        if (name === 'A and B') onEvent({ type: 'step', step: 2, total: 4 });
        await new Promise<void>((resolve) => finish.set(name, resolve));
        return batch.items.map((i) => ({ data: new Uint8Array(), contentType: 'image/png', seed: i.seed }));
      },
      8,
      (batch) => 10 * batch.items.length,
    );
    // Each its own steps, but for A's and B's that merge.
    let steps = 1;
    const from = (client: string, prompt: string, images = 1, signal?: AbortSignal, ownSteps = steps++) =>
      merger.generate(request(Array.from({ length: images }, (_, i) => item(prompt, i)), { steps: ownSteps }), signal, new Ticket(client));
    // C's batch of three images (30 s charged) holds the worker while A's four and B's one wait: they merge
    // (A charged 40 s, B 10 s, as it starts).
    const busy = from('C', 'C busy', 3);
    const cancel = new AbortController();
    const merged = from('A', 'A and B', 4, cancel.signal, 100).catch(() => 'cancelled');
    const riding = from('B', 'A and B', 1, undefined, 100);
    finish.get('C busy')!();
    await expect.poll(() => started).toEqual(['C busy', 'A and B']);
    // A leaves half-way: half its 40 s is given back, 20 s served (B 10 s, C 30 s).
    cancel.abort(new Error('client left'));
    expect(await merged).toBe('cancelled');
    const waiting = [from('A', 'A next'), from('B', 'B next'), from('C', 'C next')];
    for (let next = 1; next < 5; next++) {
      await expect.poll(() => started.length).toBeGreaterThan(next);
      finish.get(started[next])!();
    }
    await Promise.all([busy, riding, ...waiting]);
    // The least served first. Given back its whole 40 s, A went first (0 s served); given back none, last (40 s).
    expect(started.slice(2)).toEqual(['B next', 'A next', 'C next']);
  });
});
