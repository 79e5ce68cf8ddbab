import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { pino, type Logger } from 'pino';
import sharp from 'sharp';
import { loadConfig } from '../../src/config.js';
import { JobQueue, Ticket, type ClientLimits } from '../../src/engine/job-queue.js';
import type { Readiness } from '../../src/engine/worker-slots.js';
import { IMAGE_FORMATS, outputOf, type BatchItem, type GeneratedImage, type GenerationBatch } from '../../src/runtime/types.js';
import { buildApp, type AppConfig } from '../../src/http/app.js';
import type { HealthEngine } from '../../src/http/health.js';
import type { ImageEngine } from '../../src/service/images.js';
import { ModelRegistry } from '../../src/models/registry.js';
import { Metrics } from '../../src/observability/metrics.js';
import { FileImageStore } from '../../src/store/file-store.js';

/**
 * The real HTTP app, store and model registry on an ephemeral port, with a fake engine: the API's
 * behaviour is tested in milliseconds, without ONNX. Model folders are stubs that pass inspectModel.
 */

export const silentLogger = pino({ level: 'silent' });

/**
 * A folder inspectModel accepts as an SD-Turbo export (the files are never loaded by the fake engine);
 * `canEdit` adds the VAE encoder that edits and variations need.
 */
export async function writeStubModel(dir: string, override?: object, { canEdit = false } = {}): Promise<void> {
  const files: Record<string, string> = {
    ...(canEdit && { 'vae_encoder/model.onnx': '' }),
    'model_index.json': JSON.stringify({ _class_name: 'OnnxStableDiffusionPipeline', _name_or_path: 'stabilityai/sd-turbo' }),
    'unet/model.onnx': '',
    'text_encoder/model.onnx': '',
    'vae_decoder/model.onnx': '',
    'tokenizer/vocab.json': '{}',
    'tokenizer/merges.txt': '#version: 0.2\n',
    'scheduler/scheduler_config.json': JSON.stringify({ _class_name: 'EulerDiscreteScheduler', timestep_spacing: 'trailing' }),
  };
  if (override) files['imagegen.json'] = JSON.stringify(override);
  for (const [name, content] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(dir, name)), { recursive: true });
    await writeFile(path.join(dir, name), content);
  }
}

/** Sizes of the stub model: small ones keep the fake images cheap. */
export const STUB_SIZES = ['64x64', '128x64', '512x512'];

/** What the app takes as its engine (the service's and the health routes' parts), and the close a test server calls. */
export type TestEngine = ImageEngine & HealthEngine & { close(): Promise<void> };

/**
 * Draws one flat picture per item, its colour derived from the seed, through the real JobQueue so
 * queueing and cancellation behave as in the pool. `hold()` makes jobs wait until `release()`.
 */
export class FakeEngine implements TestEngine {
  readonly batches: GenerationBatch[] = [];
  readonly signals: (AbortSignal | undefined)[] = [];
  /** Who each request's ticket was for, and its limits: the queue's view of the API key. */
  readonly tickets: { client: string; limits?: ClientLimits }[] = [];
  private readonly queue: JobQueue;
  private gate: Promise<void> | undefined;
  private open: (() => void) | undefined;

  constructor(workers = 1, queueMax = 16) {
    this.queue = new JobQueue(workers, queueMax);
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

/** `E`: the engine behind the app, the fake one unless a test passes a real pool. */
export interface TestServer<E extends TestEngine = FakeEngine> {
  /** The API base URL, ending in /v1. */
  baseURL: string;
  origin: string;
  client: OpenAI;
  engine: E;
  store: FileImageStore;
  registry: ModelRegistry;
  modelsDir: string;
  dataDir: string;
  /** API_KEYS_FILE, when the options gave its lines (`keysFile`). */
  keysFile: string | undefined;
  close(): Promise<void>;
}

export interface TestServerOptions<E extends TestEngine = FakeEngine> {
  apiKeys?: string[];
  /** Serve HTTPS with this certificate and key (PEM). */
  tls?: { cert: Buffer; key: Buffer };
  aliases?: Record<string, string>;
  engine?: E;
  ttlSeconds?: number;
  maxStoreBytes?: number;
  config?: Partial<AppConfig>;
  /** Reuse an image store folder (restart tests). */
  dataDir?: string;
  /** The image store's clock (unix ms), to expire images without waiting. */
  clock?: () => number;
  /** The app's logger (default: silent). */
  logger?: Logger;
  /** An API key file's lines: written to a file the server reads as API_KEYS_FILE (no API_KEYS then). */
  keysFile?: string;
  /** The stub model can edit (its export has a VAE encoder). */
  stubCanEdit?: boolean;
}

export const TEST_KEY = 'sk-test-0123456789abcdef';

/** A server with one stub model, `stub`, aliased as dall-e-3. */
export async function startTestServer<E extends TestEngine = FakeEngine>(options: TestServerOptions<E> = {}): Promise<TestServer<E>> {
  const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-api-'));
  const modelsDir = path.join(root, 'models');
  await writeStubModel(path.join(modelsDir, 'stub'), { sizes: STUB_SIZES, default_size: '64x64' }, { canEdit: options.stubCanEdit });
  const dataDir = options.dataDir ?? path.join(root, 'data');
  const keysFile = options.keysFile === undefined ? undefined : path.join(root, 'keys');
  if (keysFile) await writeFile(keysFile, options.keysFile!);
  const apiKeys = options.apiKeys ?? (keysFile ? [] : [TEST_KEY]);

  // Without an engine of the test's, the fake one: E is then FakeEngine, its default.
  const engine = options.engine ?? (new FakeEngine() as unknown as E);
  const store = await FileImageStore.open({ dir: dataDir, ttlSeconds: options.ttlSeconds ?? 3600, maxBytes: options.maxStoreBytes ?? 1e9, logger: silentLogger, clock: options.clock });
  const registry = new ModelRegistry({
    roots: [{ dir: modelsDir, ownedBy: 'user' }],
    aliases: options.aliases ?? { 'dall-e-3': 'stub' },
    logger: silentLogger,
    minRescanIntervalMs: 0,
  });
  await registry.scan();
  const config: AppConfig = { ...loadConfig({}, {}), apiKeys, apiKeysFile: keysFile, bodyLimit: 1024 * 1024, trustProxy: true, publicBaseUrl: undefined, ...options.config };
  const app = buildApp({ config, registry, engine, store, metrics: new Metrics(), logger: options.logger ?? silentLogger, tls: options.tls });
  const origin = await app.listen({ port: 0, host: '127.0.0.1' });
  const baseURL = `${origin}/v1`;
  return {
    baseURL,
    origin,
    client: new OpenAI({ baseURL, apiKey: apiKeys[0] ?? 'unused', maxRetries: 0 }),
    engine,
    store,
    registry,
    modelsDir,
    dataDir,
    keysFile,
    async close() {
      await app.close();
      await engine.close();
      await store.close();
      registry.close();
      await rm(root, { recursive: true, force: true });
    },
  };
}
