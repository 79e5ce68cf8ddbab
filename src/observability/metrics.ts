import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { BatchOutcome, EngineMetrics } from '../engine/pool.js';
import type { ModelMemory } from '../models/memory-figures.js';

/**
 * The service's Prometheus metrics, in a registry of its own (not prom-client's global one, so two
 * servers in one process, as in the tests, never mix their numbers). The engine reports through the
 * EngineMetrics methods, the HTTP layer through httpRequest(); gauges read their sources at scrape time.
 * Steps per second: rate(imagegen_denoising_steps_total) / rate(imagegen_generation_duration_seconds_sum).
 */

/** What the gauges read when scraped. */
export interface MetricSources {
  queue(): { running: number; queued: number };
  workers(): { total: number; ready: number };
  modelsHeld(): Record<string, number>;
  store(): { files: number; bytes: number };
  /** The figures kept for each installed model (by its id) and planned with, where it has any for its files as they are now. */
  modelMemory(): Record<string, ModelMemory>;
}

/**
 * Seconds, from a fast request to a long queue wait or a large generation on a CPU: a full-size SDXL
 * batch of four at 30 steps takes tens of minutes there, and FLUX's more, so the buckets go to an hour
 * (beyond 300 s every such batch fell in +Inf alone).
 */
const DURATION_BUCKETS = [0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600];

/** What the HTTP layer's memory budgets hold now, in bytes. */
export interface RequestMemory {
  upload(): number;
  answer(): number;
}

export class Metrics implements EngineMetrics {
  readonly registry = new Registry();
  private sources: MetricSources | undefined;
  /** The bytes UPLOAD_MEMORY and ANSWER_MEMORY hold, read from the HTTP layer's budgets (see watchMemory). */
  private memory: RequestMemory | undefined;

  private readonly httpRequests = new Counter({
    name: 'imagegen_http_requests_total',
    help: 'HTTP requests answered, by route (unmatched for unknown URLs, before_routing for those refused before any route: malformed HTTP or URLs, headers too large, CONNECT) and status (499: the client left first)',
    labelNames: ['method', 'route', 'status'],
    registers: [this.registry],
  });
  private readonly httpDuration = new Histogram({
    name: 'imagegen_http_request_duration_seconds',
    help: 'Time from receiving a request to finishing its response, by route',
    labelNames: ['route'],
    buckets: DURATION_BUCKETS,
    registers: [this.registry],
  });
  private readonly queueWaitSeconds = new Histogram({
    name: 'imagegen_queue_wait_seconds',
    help: 'Time generation jobs waited for a worker, until they started or gave up (queue_timeout)',
    buckets: DURATION_BUCKETS,
    registers: [this.registry],
  });
  private readonly generationSeconds = new Histogram({
    name: 'imagegen_generation_duration_seconds',
    help: 'Time a worker spent on one batch (merged requests share one), less loading its model (imagegen_model_load_duration_seconds), by model and outcome',
    labelNames: ['model', 'outcome'],
    buckets: DURATION_BUCKETS,
    registers: [this.registry],
  });
  private readonly denoisingSteps = new Counter({
    name: 'imagegen_denoising_steps_total',
    help: 'Denoising steps run, also by batches stopped early (one step of a merged batch counts once)',
    labelNames: ['model'],
    registers: [this.registry],
  });
  private readonly imagesGenerated = new Counter({
    name: 'imagegen_images_generated_total',
    help: 'Images generated',
    labelNames: ['model'],
    registers: [this.registry],
  });
  private readonly partialImages = new Counter({
    name: 'imagegen_partial_images_total',
    help: 'Previews of images sent while they were denoised (streamed partial images)',
    labelNames: ['model'],
    registers: [this.registry],
  });
  private readonly modelLoadSeconds = new Histogram({
    name: 'imagegen_model_load_duration_seconds',
    help: 'Time a worker took to load a model',
    labelNames: ['model'],
    // A FLUX.1 export's 68 GB read from a disk at 100 MB/s takes over ten minutes.
    buckets: [0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800],
    registers: [this.registry],
  });
  private readonly memoryWaits = new Counter({
    name: 'imagegen_memory_waits_total',
    help: "Times a batch waited for memory another worker's running batch had planned on",
    registers: [this.registry],
  });
  private readonly connectionsDropped = new Counter({
    name: 'imagegen_connections_dropped_total',
    help: 'Client connections reset as they arrived because MAX_CONNECTIONS were open',
    registers: [this.registry],
  });
  private readonly workerRestarts = new Counter({
    name: 'imagegen_worker_restarts_total',
    help: 'Worker processes that died (crash, out of memory, killed) and were replaced',
    registers: [this.registry],
  });

  constructor() {
    this.gaugeAtScrape('imagegen_queue_jobs', 'Generation jobs running on a worker and waiting for one', (sources) => sources.queue());
    this.gaugeAtScrape('imagegen_workers', 'Worker processes configured and ready (started and done preloading)', (sources) => sources.workers());
    this.gaugeAtScrape('imagegen_model_workers', 'Worker processes holding each model loaded now (a model none holds is absent: the next request for it loads it)', (sources) => sources.modelsHeld(), 'model');
    this.gaugeAtScrape('imagegen_store_images', 'Images in the image store', (sources) => sources.store().files);
    this.gaugeAtScrape('imagegen_store_bytes', 'Bytes the image store counts against MAX_STORE_BYTES: each image as at least 4 KiB (a disk block), writes in progress included', (sources) => sources.store().bytes);
    this.gaugeReading(
      'imagegen_upload_memory_bytes',
      'Bytes of request bodies (uploaded images, JSON) held in memory, from their first byte until their request ends, counted against UPLOAD_MEMORY',
      () => this.memory?.upload(),
    );
    this.gaugeReading(
      'imagegen_answer_memory_bytes',
      'Bytes of answers (b64_json images, streamed events) held in memory for clients that have not read them yet, and set aside for answers being made (the most each may take), counted against ANSWER_MEMORY',
      () => this.memory?.answer(),
    );
    const sources = () => this.sources;
    new Gauge({
      name: 'imagegen_model_memory_bytes',
      help: "What an installed model was measured to take in the workers, as kept in DATA_DIR and planned with (the most seen): 'weights' its resident growth on load, 'peak' the most one batch took on top, 'denoise' what its denoising took per sample (an image, two with guidance) at the largest size it ran, 'decode' the most one VAE decoder call took",
      labelNames: ['model', 'kind'],
      registers: [this.registry],
      collect() {
        const figures = sources()?.modelMemory();
        if (!figures) return;
        // Read at each scrape, not set as measured: a model removed since goes from the output, and one
        // measured by an earlier server shows before a worker loads it, as `imagegen models list` shows it.
        this.reset();
        for (const [model, memory] of Object.entries(figures)) for (const [kind, bytes] of Object.entries(memoryByKind(memory))) this.set({ model, kind }, bytes);
      },
    });
    collectDefaultMetrics({ register: this.registry, prefix: 'imagegen_' });
  }

  /** A gauge whose value `read` takes from the sources at each scrape (see gaugeReading); nothing before watch() connected them. */
  private gaugeAtScrape(name: string, help: string, read: (sources: MetricSources) => number | Record<string, number>, label = 'state'): void {
    this.gaugeReading(name, help, () => this.sources && read(this.sources), label);
  }

  /**
   * A gauge whose value `read` gives at each scrape: one number, or one per value of `label` (e.g.
   * running and queued states); nothing while it gives none (what it reads is not connected yet).
   */
  private gaugeReading(name: string, help: string, read: () => number | Record<string, number> | undefined, label = 'state'): void {
    new Gauge({
      name,
      help,
      labelNames: [label],
      registers: [this.registry],
      collect() {
        const value = read();
        if (value === undefined) return;
        if (typeof value === 'number') return this.set(value);
        // A value no longer read (a model no worker holds) goes from the output.
        this.reset();
        for (const [key, n] of Object.entries(value)) this.set({ [label]: key }, n);
      },
    });
  }

  /** Connects the gauges to the running parts, which are built after the metrics they report to. */
  watch(sources: MetricSources): void {
    this.sources = sources;
  }

  /** Connects imagegen_upload_memory_bytes and imagegen_answer_memory_bytes to the budgets the HTTP app builds (http/app.ts). */
  watchMemory(memory: RequestMemory): void {
    this.memory = memory;
  }

  /** A request answered; `seconds` from its arrival, where that is known (not for what Node's parser refused). */
  httpRequest(method: string, route: string, status: number, seconds?: number): void {
    this.httpRequests.inc({ method, route, status });
    if (seconds !== undefined) this.httpDuration.observe({ route }, seconds);
  }

  queueWait(seconds: number): void {
    this.queueWaitSeconds.observe(seconds);
  }

  batchFinished({ model, images, steps, seconds, outcome }: { model: string; images: number; steps: number; seconds: number; outcome: BatchOutcome }): void {
    this.generationSeconds.observe({ model, outcome }, seconds);
    this.denoisingSteps.inc({ model }, steps);
    this.imagesGenerated.inc({ model }, images);
  }

  partialImage(model: string): void {
    this.partialImages.inc({ model });
  }

  memoryWaited(): void {
    this.memoryWaits.inc();
  }

  modelLoaded(model: string, seconds: number): void {
    this.modelLoadSeconds.observe({ model }, seconds);
  }

  connectionDropped(): void {
    this.connectionsDropped.inc();
  }

  workerReplaced(): void {
    this.workerRestarts.inc();
  }
}

/** A model's figures by the gauge's kinds: those it has. */
function memoryByKind(memory: ModelMemory): Record<string, number> {
  const kinds: Record<string, number> = { weights: memory.weightsBytes, peak: memory.peakBytes };
  const largest = memory.denoise?.at(-1);
  if (largest) kinds.denoise = largest.bytes;
  if (memory.decode) kinds.decode = memory.decode.bytes;
  return kinds;
}
