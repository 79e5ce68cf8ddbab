import { readFile } from 'node:fs/promises';
import path from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { EMBEDDED_MODELS_DIR, type Config } from './config.js';
import { createEnginePool } from './engine/pool.js';
import { buildApp } from './http/app.js';
import { ModelRegistry, modelRoots } from './models/registry.js';
import { ImageStore } from './store/image-store.js';

/** Puts the service together (store, models, engine, HTTP app) and starts listening. */

export interface RunningServer {
  app: FastifyInstance;
  /** Where it listens, e.g. http://127.0.0.1:8000 (the API's base URL adds /v1). */
  url: string;
  /** Stops taking requests, lets running ones finish, then stops the workers. */
  close(): Promise<void>;
}

const SWEEP_INTERVAL_MS = 60_000;

export async function startServer(config: Config, logger: Logger): Promise<RunningServer> {
  const store = await ImageStore.open({
    dir: path.resolve(config.dataDir, 'images'),
    ttlSeconds: config.imageTtlSeconds,
    maxBytes: config.maxStoreBytes,
    logger: logger.child({ component: 'store' }),
  });
  store.startSweeper(SWEEP_INTERVAL_MS);

  const registry = new ModelRegistry({
    roots: modelRoots(config.modelsDir, EMBEDDED_MODELS_DIR),
    aliases: config.modelAliases,
    logger: logger.child({ component: 'models' }),
  });
  await registry.scan();
  registry.startRescanning(config.modelsRescanSeconds * 1000);
  if (!(await registry.resolve(config.defaultModel))) {
    logger.warn(`default model '${config.defaultModel}' is not installed: requests for ${Object.keys(config.modelAliases).join(', ')} will fail until it is`);
  }

  const engine = createEnginePool({ workers: config.workers, queueMax: config.queueMax, executionProvider: config.executionProvider, cudaDevices: config.cudaDevices });
  const tls = config.tlsCert && config.tlsKey ? { cert: await readFile(config.tlsCert), key: await readFile(config.tlsKey) } : undefined;
  const app = buildApp({ config, registry, engine, store, logger, tls });
  const close = async () => {
    await app.close();
    await engine.close();
    registry.close();
    store.close();
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
  if (config.apiKeys.length === 0) {
    logger.warn(`no API_KEYS set: every local client may use the server; it listens on loopback (${config.host}) only`);
  }
  logger.info({ url: `${url}/v1`, models: registry.list().map((m) => m.id), workers: config.workers }, 'imagegen ready');
  return { app, url, close };
}
