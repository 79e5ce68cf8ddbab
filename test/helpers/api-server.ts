import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import type { Logger } from 'pino';
import { loadConfig } from '../../src/config.js';
import { buildApp, type AppConfig } from '../../src/http/app.js';
import { ModelRegistry } from '../../src/models/registry.js';
import { Metrics } from '../../src/observability/metrics.js';
import { FileImageStore } from '../../src/store/file-store.js';
import { DEMO_MODEL_DIR } from './demo-model.js';
import { RealEngine, type TestEngine } from './engines.js';
import { silentLogger } from './logs.js';

/**
 * The real HTTP app, store, model registry and engine (a worker pool running the embedded demo model at
 * small sizes: a generation takes milliseconds) on an ephemeral port. A test that must hold jobs at a
 * precise point passes a FakeEngine (engines.ts), and says why.
 */

/** A ModelProto holding only an empty graph (field 7, length 0): the least inspectModel takes for a graph file, which an empty file is not. */
const EMPTY_GRAPH = Buffer.from([0x3a, 0x00]);

/**
 * A folder inspectModel accepts as an SD-Turbo export, its graphs empty: for tests of what the
 * registry makes of a folder, which no engine loads (a server's model is writeDemoModel's). `canEdit`
 * adds the VAE encoder that edits and variations need.
 */
export async function writeStubModel(dir: string, override?: object, { canEdit = false } = {}): Promise<void> {
  const files: Record<string, string | Buffer> = {
    ...(canEdit && { 'vae_encoder/model.onnx': EMPTY_GRAPH }),
    'model_index.json': JSON.stringify({ _class_name: 'OnnxStableDiffusionPipeline', _name_or_path: 'stabilityai/sd-turbo' }),
    'unet/model.onnx': EMPTY_GRAPH,
    'text_encoder/model.onnx': EMPTY_GRAPH,
    'vae_decoder/model.onnx': EMPTY_GRAPH,
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

/** Sizes of the test servers' model, `stub`: small ones keep its images cheap. */
export const STUB_SIZES = ['64x64', '128x64', '512x512'];

/**
 * A copy of the embedded demo model at `dir` whose imagegen.json takes `override` over its own (e.g.
 * other sizes); `canEdit: false` drops its VAE encoder, as exports that can draw but not edit lack it.
 */
export async function writeDemoModel(dir: string, override: object, { canEdit = true } = {}): Promise<void> {
  await cp(DEMO_MODEL_DIR, dir, { recursive: true });
  const preset = JSON.parse(await readFile(path.join(DEMO_MODEL_DIR, 'imagegen.json'), 'utf8')) as object;
  await writeFile(path.join(dir, 'imagegen.json'), JSON.stringify({ ...preset, ...override }));
  if (!canEdit) await rm(path.join(dir, 'vae_encoder'), { recursive: true });
}

/** `E`: the engine behind the app, the file's worker pool unless a test passes another. */
export interface TestServer<E extends TestEngine = RealEngine> {
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

export interface TestServerOptions<E extends TestEngine = RealEngine> {
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
  /** The model can edit (its export keeps the VAE encoder). */
  stubCanEdit?: boolean;
}

export const TEST_KEY = 'sk-test-0123456789abcdef';

/** A server with one model, `stub` (the demo model at STUB_SIZES), aliased as dall-e-3. */
export async function startTestServer<E extends TestEngine = RealEngine>(options: TestServerOptions<E> = {}): Promise<TestServer<E>> {
  const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-api-'));
  const modelsDir = path.join(root, 'models');
  await writeDemoModel(path.join(modelsDir, 'stub'), { sizes: STUB_SIZES, default_size: '64x64' }, { canEdit: options.stubCanEdit ?? false });
  const dataDir = options.dataDir ?? path.join(root, 'data');
  const keysFile = options.keysFile === undefined ? undefined : path.join(root, 'keys');
  if (keysFile) await writeFile(keysFile, options.keysFile!);
  const apiKeys = options.apiKeys ?? (keysFile ? [] : [TEST_KEY]);

  // Without an engine of the test's, the file's pool: E is then RealEngine, its default.
  const engine = options.engine ?? (new RealEngine() as unknown as E);
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
