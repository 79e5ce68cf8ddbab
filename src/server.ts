import { readFile } from 'node:fs/promises';
import { createSecureContext } from 'node:tls';
import path from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { EMBEDDED_MODELS_DIR, type Config } from './config.js';
import { createEnginePool, type EnginePoolOptions, type WorkerPool } from './engine/pool.js';
import { buildApp } from './http/app.js';
import type { ModelRef } from './runtime/types.js';
import { defaultWorkerCount, workersSharingADevice } from './engine/worker-count.js';
import { availableBytes } from './runtime/memory.js';
import { figuresFor, openKeptFigures, type MemoryFigures, type ModelMemory } from './models/memory-figures.js';
import { ModelRegistry, modelRoots } from './models/registry.js';
import { Metrics } from './observability/metrics.js';
import { openImageStore, type SweptStore } from './store/open-store.js';
import { KeyRates } from './http/key-rates.js';
import { KeySlots } from './http/key-slots.js';
import { connectRedis } from './http/redis.js';
import { RedisLedger } from './http/redis-ledger.js';
import { readKeyFile } from './http/keys.js';
import { MODEL_BUDGET_SHARE } from './pipelines/run.js';
import { gpusInUse, nvidiaGpus } from './runtime/nvidia-gpus.js';
import { formatBytes } from './util/bytes.js';
import { whyUnreadable } from './util/error-message.js';
import { plural } from './util/plural.js';

/** Puts the service together (store, models, engine, HTTP app) and starts listening. */

export interface RunningServer {
  app: FastifyInstance;
  /** Where it listens, e.g. http://127.0.0.1:8000 (the API's base URL adds /v1). */
  url: string;
  /** The engine, for tests (they watch its queue and kill its worker processes). */
  engine: WorkerPool;
  /** Stops taking requests, lets running ones finish (for SHUTDOWN_TIMEOUT_SECONDS at most), then stops the workers. */
  close(): Promise<void>;
}

const SWEEP_INTERVAL_MS = 60_000;

/** A TLS_CERT or TLS_KEY that cannot be read; the message names the setting. */
class TlsFileError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TlsFileError';
  }
}

/**
 * Reads TLS_CERT or TLS_KEY, naming the setting in what goes wrong: the system's error names only the
 * path, and for a folder (EISDIR) not even that.
 */
async function readTlsFile(setting: 'TLS_CERT' | 'TLS_KEY', file: string): Promise<Buffer> {
  return readFile(file).catch((err: unknown) => {
    throw new TlsFileError(`${setting} ${file} ${whyUnreadable(err)}: set ${setting} to the PEM ${setting === 'TLS_CERT' ? 'certificate (chain)' : 'private key'} file`);
  });
}

/**
 * What tests may replace: the image store's clock (expiry without waiting for it), and the workers'
 * module (see EnginePoolOptions.workerScript).
 */
export interface ServerOverrides {
  clock?: () => number;
  workerScript?: string;
}

export async function startServer(config: Config, logger: Logger, { clock, workerScript }: ServerOverrides = {}): Promise<RunningServer> {
  // Read and checked first: a file that is missing or no PEM stops the start before any worker process is started.
  const tls = config.tlsCert && config.tlsKey ? { cert: await readTlsFile('TLS_CERT', config.tlsCert), key: await readTlsFile('TLS_KEY', config.tlsKey) } : undefined;
  if (tls) createSecureContext(tls);
  // The same for the keys (the auth plugin reads them again as the app starts, and then on every change).
  if (config.apiKeysFile) await readKeyFile(config.apiKeysFile);
  const store = await openStore(config, logger, clock);
  store.startSweeper(SWEEP_INTERVAL_MS);
  await logStoredImages(config, store, logger);
  // With REDIS_URL the replicas share API_KEYS_FILE's per-key limits; without it this server counts alone.
  const redisLog = logger.child({ component: 'redis' });
  const redis = config.redisUrl ? await connectRedis(config.redisUrl, redisLog) : undefined;
  const rates = redis && new KeyRates(new RedisLedger(redis, redisLog));
  const slots = redis && new KeySlots(redis, redisLog, { maxWaitMs: config.queueTimeoutSeconds * 1000 });

  const registry = new ModelRegistry({
    roots: modelRoots(config.modelsDir, EMBEDDED_MODELS_DIR),
    aliases: config.modelAliases,
    logger: logger.child({ component: 'models' }),
  });
  await registry.scan();
  registry.startRescanning(config.modelsRescanSeconds * 1000);
  if (!(await registry.resolve(config.defaultModel))) {
    // Only the aliases naming it fail with it: those MODEL_ALIASES points at other models still answer.
    const failing = Object.keys(config.modelAliases).filter((alias) => config.modelAliases[alias] === config.defaultModel);
    const aliases = failing.length > 0 ? `, and those for ${failing.join(', ')},` : '';
    logger.warn(`default model '${config.defaultModel}' ${registry.whyNone(config.defaultModel)}: requests that name no model${aliases} will fail until it can be used`);
  }

  const metrics = new Metrics();
  const memoryFigures = await openMemoryFigures(config, logger);
  const preload = await preloadDirs(config.preload, registry, logger);
  const workers = config.workers ?? chosenWorkerCount(config, preload, memoryFigures, logger);
  const engine = createEnginePool({
    ...engineSettings(config),
    modelMemoryBudget: await modelMemoryBudget(config, workers, logger),
    workers,
    preload,
    modelVersion: (dir) => registry.versionOf(dir),
    memoryFigures,
    workerScript,
    logger: logger.child({ component: 'engine' }),
    metrics,
  });
  metrics.watch({
    queue: () => engine.load(),
    workers: () => engine.readiness().workers,
    modelsHeld: () => engine.modelsHeld(),
    store: () => store.stats(),
    modelMemory: () => keptFiguresOfInstalled(registry, memoryFigures),
  });
  const app = buildApp({ config, registry, engine, store, metrics, logger, tls, rates, slots });
  const close = async () => {
    await app.close();
    await engine.close();
    await memoryFigures.flushed();
    registry.close();
    await store.close();
    slots?.close();
    redis?.disconnect();
  };
  try {
    await app.listen({ port: config.port, host: config.host });
  } catch (err) {
    await close();
    throw err;
  }

  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : config.port;
  const host = config.host.includes(':') ? `[${config.host}]` : config.host;
  const url = `${tls ? 'https' : 'http'}://${host}:${port}`;
  if (config.apiKeys.length === 0 && !config.apiKeysFile) {
    logger.warn(`no API_KEYS or API_KEYS_FILE set: every local client may use the server; it listens on loopback (${config.host}) only`);
  }
  // Listening, not yet ready: /ready says when the workers have loaded the models (the log says "worker ready").
  // Behind a proxy, or on every interface (0.0.0.0), the address clients use is PUBLIC_BASE_URL's.
  const clientUrl = `${config.publicBaseUrl ?? url}/v1`;
  logger.info({ url: clientUrl, models: registry.list().map((m) => m.id), workers }, 'imagegen listening');
  return { app, url, engine, close };
}

/** The image store that STORE and its settings name (DATA_DIR/images or the bucket), open. */
function openStore(config: Config, logger: Logger, clock: ServerOverrides['clock']): Promise<SweptStore> {
  return openImageStore(
    {
      kind: config.store,
      dir: path.resolve(config.dataDir, 'images'),
      s3: {
        bucket: config.s3Bucket,
        prefix: config.s3Prefix,
        endpoint: config.s3Endpoint,
        region: config.s3Region,
        forcePathStyle: config.s3ForcePathStyle,
        presignedUrls: config.s3PresignedUrls,
      },
    },
    { ttlSeconds: config.imageTtlSeconds, maxBytes: config.maxStoreBytes, logger: logger.child({ component: 'store' }), clock },
  );
}

/**
 * Says where the image store is and what it kept from before the start. Image URLs outlive a restart only
 * if the new server opens the same store: DATA_DIR is relative to the working directory by default, so a
 * server started from another folder (or with a mistyped DATA_DIR) began with an empty store and answered
 * every URL given out before with 404, and nothing in its log said so.
 */
async function logStoredImages(config: Config, store: SweptStore, logger: Logger): Promise<void> {
  const where = config.store === 'fs' ? path.resolve(config.dataDir, 'images') : `the S3 bucket '${config.s3Bucket}' under '${config.s3Prefix}'`;
  // A store that cannot be used (a bucket that failed as it opened, logged then) may hold more than it counted.
  const unusable = await store.check().then(
    () => '',
    () => '; it cannot be used now (see the error above), and may hold more than it counted',
  );
  const { files, bytes } = store.stats();
  const held =
    files === 0
      ? 'no unexpired images from before the start'
      : `${plural(files, 'unexpired image')} (${formatBytes(bytes)} of MAX_STORE_BYTES, ${formatBytes(config.maxStoreBytes)}) from before the start, served until they expire`;
  logger.info({ images: files, bytes }, `image store: ${where}: ${held}${unusable}`);
}

/** The models' measured memory kept in DATA_DIR, as the commands that run models read it too; a file set aside (older or damaged) and a write that fails are logged. */
function openMemoryFigures(config: Config, logger: Logger): Promise<MemoryFigures> {
  return openKeptFigures(
    config.dataDir,
    { provider: config.executionProvider, graphRewrites: config.graphRewrites },
    { info: (message) => logger.info(message), warn: (message, err) => logger.warn({ err }, message) },
  );
}

/** The engine pool's options that come from the settings alone. */
function engineSettings(config: Config) {
  return {
    queueMax: config.queueMax,
    queueMaxSeconds: config.queueMaxSeconds || undefined,
    queueTimeoutMs: config.queueTimeoutSeconds * 1000,
    stallTimeoutMs: config.workerStallTimeoutSeconds * 1000,
    executionProvider: config.executionProvider,
    threadsPerWorker: config.workerThreads,
    threadSpinning: config.ortThreadSpinning,
    graphRewrites: config.graphRewrites,
    workerNice: config.workerNice,
    mallocHugePages: config.mallocHugePages,
    vaeTiling: config.vaeTiling,
    cudaDevices: config.cudaDevices,
    memoryLimit: config.memoryLimit,
  } satisfies Partial<EnginePoolOptions>;
}

/** The default WORKERS for the models to preload and the memory measured (worker-count.ts), logged with its reason. */
function chosenWorkerCount(config: Config, preload: ModelRef[], figures: MemoryFigures, logger: Logger): number {
  const { workers, reason } = defaultWorkerCount({
    provider: config.executionProvider,
    cudaDevices: config.cudaDevices,
    preload,
    measured: figures.all(),
    availableBytes: availableBytes(),
    threadsPerWorker: config.workerThreads,
  });
  logger.info({ workers }, `WORKERS not set: ${workers} worker process${workers > 1 ? 'es' : ''}, ${reason}`);
  return workers;
}

/**
 * MODEL_MEMORY_BUDGET, all workers together, or undefined for the pool's default (a share of RAM). On
 * CUDA, where the weights are on the GPU, unset it is that share of the memory of the GPUs the workers
 * run on (the smallest of them), for each device, split among the workers on it: RAM's share let a
 * 64 GB host load 38 GB of models into a 24 GB card. Where nvidia-smi cannot tell which GPUs those are
 * (see gpusInUse), the smallest GPU's.
 */
async function modelMemoryBudget(config: Config, workers: number, logger: Logger): Promise<number | undefined> {
  if (config.modelMemoryBudget !== undefined || config.executionProvider !== 'cuda') return config.modelMemoryBudget;
  const ramInstead = (why: string) => {
    logger.warn(`MODEL_MEMORY_BUDGET is not set and ${why}: the loaded models are kept within ${MODEL_BUDGET_SHARE * 100}% of RAM, not of the GPU's memory. Set MODEL_MEMORY_BUDGET to about the GPUs' memory together, less room for the batches' activations.`);
    return undefined;
  };
  const listed = await nvidiaGpus();
  if ('problem' in listed) return ramInstead(listed.problem);
  const inUse = gpusInUse(listed, config.cudaDevices, process.env);
  if (!inUse) {
    const visible = process.env.CUDA_VISIBLE_DEVICES === undefined ? '' : ` within CUDA_VISIBLE_DEVICES=${process.env.CUDA_VISIBLE_DEVICES}`;
    return ramInstead(`CUDA_DEVICES (${config.cudaDevices.join(',')}) names none of the ${plural(listed.length, 'GPU')} nvidia-smi lists${visible}`);
  }
  if ('migInstance' in inUse) return ramInstead(`CUDA_VISIBLE_DEVICES gives the workers MIG instance ${inUse.migInstance}, whose memory nvidia-smi does not give (only its GPU's, whole)`);
  const split = inUse.gpus.find((gpu) => gpu.mig);
  if (split) return ramInstead(`GPU ${split.index} is split into MIG instances, whose memory nvidia-smi does not give (only the whole GPU's)`);
  const smallest = inUse.gpus[0];
  const sharing = workersSharingADevice(workers, config.cudaDevices);
  const perWorker = Math.floor((smallest.memoryBytes * MODEL_BUDGET_SHARE) / sharing);
  const unequal = listed.some((gpu) => gpu.memoryBytes !== smallest.memoryBytes);
  const which = inUse.exact
    ? `GPU ${smallest.index}'s ${formatBytes(smallest.memoryBytes)}${inUse.gpus.length > 1 ? `, the smallest of the ${inUse.gpus.length} CUDA_DEVICES gives the workers` : ''}`
    : `the smallest GPU's ${formatBytes(smallest.memoryBytes)} (nvidia-smi lists ${plural(listed.length, 'GPU')}${unequal ? '; CUDA numbers them fastest first, which nvidia-smi cannot tell: set CUDA_DEVICE_ORDER=PCI_BUS_ID, or name the GPUs by UUID in CUDA_VISIBLE_DEVICES, to count only those the workers use' : ''})`;
  logger.info(
    { modelMemoryBudget: perWorker * workers },
    `MODEL_MEMORY_BUDGET not set: each worker keeps up to ${formatBytes(perWorker)} of model weights loaded, ${MODEL_BUDGET_SHARE * 100}% of ${which}${sharing > 1 ? `, split among the ${sharing} workers that share a device` : ''}`,
  );
  return perWorker * workers;
}

/** The models to preload; one that is not installed, or cannot be used, is skipped with a warning. */
async function preloadDirs(names: string[], registry: ModelRegistry, logger: Logger): Promise<ModelRef[]> {
  const models = new Map<string, ModelRef>();
  for (const name of names) {
    const model = await registry.resolve(name);
    if (model) models.set(model.layout.dir, { dir: model.layout.dir, version: model.version });
    else logger.warn(`PRELOAD names '${name}', which ${registry.whyNone(name)}: not preloading it`);
  }
  return [...models.values()];
}

/** The figures kept for each installed model (aliases aside) that are of its files as they are now (see figuresFor). */
function keptFiguresOfInstalled(registry: ModelRegistry, figures: MemoryFigures): Record<string, ModelMemory> {
  const kept: Record<string, ModelMemory> = {};
  for (const { id, model } of registry.list()) {
    const memory = id === model.id ? figuresFor(figures.of(model.layout.dir), model.version) : undefined;
    if (memory) kept[id] = memory;
  }
  return kept;
}
