import sharp from 'sharp';
import { afterAll } from 'vitest';
import { JobQueue, Ticket, type ClientLimits } from '../../src/engine/job-queue.js';
import type { WorkerPool } from '../../src/engine/pool.js';
import type { Readiness } from '../../src/engine/worker-slots.js';
import type { HealthEngine } from '../../src/http/health.js';
import { IMAGE_FORMATS, outputOf, type BatchEvent, type BatchItem, type GeneratedImage, type GenerationBatch } from '../../src/runtime/types.js';
import type { ImageEngine } from '../../src/service/images.js';
import { createBuiltPool } from './cli.js';

/**
 * The engines of the test servers (api-server.ts): the real one, a worker pool running the models the
 * requests name, and a fake one for the tests that must hold jobs at a precise point.
 */

/** What the app takes as its engine (the service's and the health routes' parts), and the close a test server calls. */
export type TestEngine = ImageEngine & HealthEngine & { close(): Promise<void> };

/**
 * The worker pool of this test file's servers: one worker, started when a server first asks the engine
 * anything (a generation, or its load for /health and a request's admission, its readiness for /ready: a
 * file whose servers are asked none of these starts none), stopped when the file ends. Vitest runs each test file in
 * its own process, so each file has its own; sharing it pays the worker's start (half a second) once.
 * The afterAll below joins the file that imports this module as vitest collects it (so no script run
 * outside vitest may import this module, nor api-server.ts).
 */
let filePool: WorkerPool | undefined;
const pool = (): WorkerPool => (filePool ??= createBuiltPool({ workers: 1, queueMax: 16, executionProvider: 'cpu', threadsPerWorker: 1 }));
afterAll(async () => {
  await filePool?.close();
  filePool = undefined;
});

/**
 * A test server's engine: the file's worker pool, with what the service handed it recorded (the batches
 * as asked, the signals that cancel them, and each request's ticket) for tests that check what HTTP
 * made of a request. Closing it leaves the pool to the file's other servers.
 */
export class RealEngine implements TestEngine {
  readonly batches: GenerationBatch[] = [];
  readonly signals: (AbortSignal | undefined)[] = [];
  /** Who each request's ticket was for, and its limits: the queue's view of the API key. */
  readonly tickets: { client: string; limits?: ClientLimits }[] = [];

  generate(batch: GenerationBatch, signal?: AbortSignal, ticket?: Ticket, onEvent?: (event: BatchEvent) => void): Promise<GeneratedImage[]> {
    this.batches.push(batch);
    this.signals.push(signal);
    return pool().generate(batch, signal, ticket, onEvent);
  }

  ticket(batches: readonly GenerationBatch[], client?: string, limits?: ClientLimits): Ticket {
    const ticket = pool().ticket(batches, client, limits);
    this.tickets.push({ client: ticket.client, limits });
    return ticket;
  }

  load() {
    return pool().load();
  }

  waitOutside(ticket: Ticket) {
    return pool().waitOutside(ticket);
  }

  wouldRefuse(client?: string, limits?: ClientLimits) {
    return pool().wouldRefuse(client, limits);
  }

  readiness(): Readiness {
    return pool().readiness();
  }

  async close() {}
}

/**
 * Draws one flat picture per item, its colour derived from the seed, through the real JobQueue so
 * queueing and cancellation behave as in the pool. `hold()` makes jobs wait until `release()`: for
 * tests that need jobs held running or queued at a precise moment, which a real generation does not
 * wait for. `batches` are those it ran.
 */
export class FakeEngine implements TestEngine {
  readonly batches: GenerationBatch[] = [];
  readonly signals: (AbortSignal | undefined)[] = [];
  /** Who each request's ticket was for, and its limits: the queue's view of the API key. */
  readonly tickets: { client: string; limits?: ClientLimits }[] = [];
  private readonly queue: JobQueue;
  private gate: Promise<void> | undefined;
  private open: (() => void) | undefined;

  /** `maxWaitMs`: QUEUE_TIMEOUT_SECONDS's bound, none by default. */
  constructor(workers = 1, queueMax = 16, maxWaitMs?: number) {
    this.queue = new JobQueue(workers, queueMax, { maxWaitMs });
  }

  hold(): void {
    this.gate = new Promise((resolve) => (this.open = resolve));
  }

  release(): void {
    this.open?.();
    this.gate = undefined;
  }

  ticket(_batches: readonly GenerationBatch[], client?: string, limits?: ClientLimits): Ticket {
    const ticket = new Ticket(client, 0, limits);
    this.tickets.push({ client: ticket.client, limits });
    return ticket;
  }

  generate(batch: GenerationBatch, signal?: AbortSignal, ticket?: Ticket): Promise<GeneratedImage[]> {
    this.signals.push(signal);
    return this.queue.run(
      async () => {
        this.batches.push(batch);
        await this.gate;
        return Promise.all(batch.items.map((item) => draw(batch, item)));
      },
      signal,
      { ticket },
    );
  }

  load() {
    return this.queue.load();
  }

  waitOutside(ticket: Ticket) {
    return this.queue.waitOutside(ticket);
  }

  wouldRefuse(client?: string, limits?: ClientLimits) {
    return this.queue.wouldRefuse(client, limits);
  }

  readiness(): Readiness {
    return { ready: true, started: true, workers: { total: 1, ready: 1 }, models: [] };
  }

  async close() {
    this.queue.close();
  }
}


async function draw(batch: GenerationBatch, item: BatchItem): Promise<GeneratedImage> {
  const { seed } = item;
  const { format, compression } = outputOf(item);
  const background = { r: seed % 256, g: (seed >> 8) % 256, b: (seed >> 16) % 256 };
  const image = sharp({ create: { width: batch.width, height: batch.height, channels: 3, background } });
  const data = await image.toFormat(format, compression === undefined ? {} : { quality: compression }).toBuffer();
  return { data: new Uint8Array(data), contentType: IMAGE_FORMATS[format].contentType, seed };
}
