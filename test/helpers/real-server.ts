import { cp, mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import type { Logger } from 'pino';
import { loadConfig } from '../../src/config.js';
import { writeMemoryFigures, type ModelMemory } from '../../src/models/memory-figures.js';
import { startServer, type RunningServer } from '../../src/server.js';
import { silentLogger } from './logs.js';
import { WORKER_SCRIPT } from './cli.js';
import { TEST_SETTINGS } from './test-settings.js';

/**
 * The whole service as `imagegen serve` runs it (config, worker processes, real pipelines) started in
 * this process on an ephemeral port, with its own DATA_DIR and MODELS_DIR, and the official client
 * pointed at it. The embedded demo model is always there too.
 */

/** A model folder to install: linked as it is (read-only data), or copied with an `imagegen.json`. */
export type ModelSource = { link: string } | { copy: string; preset?: object };

/** Installs models by id into a models folder. */
export async function installModels(modelsDir: string, models: Record<string, ModelSource>): Promise<void> {
  await mkdir(modelsDir, { recursive: true });
  for (const [id, source] of Object.entries(models)) {
    const dir = path.join(modelsDir, id);
    if ('link' in source) {
      await symlink(source.link, dir);
    } else {
      await cp(source.copy, dir, { recursive: true });
      if (source.preset) await writeFile(path.join(dir, 'imagegen.json'), JSON.stringify(source.preset));
    }
  }
}

/**
 * Memory figures that say nothing yet of what a model's runs take (no size measured): a runtime that
 * holds them for a model does not calibrate it as it loads (WorkerRuntime.calibrate: a run with guidance
 * at 1/2 and at 3/4 of its native side, seconds of the cores for each larger export), and plans its
 * batches as a system that cannot measure their phases does, by the decoder's attention alone, until its
 * own runs measure them. For tests of what the models draw; memory*.test.ts test the calibration.
 */
export const UNMEASURED: ModelMemory = { weightsBytes: 0, peakBytes: 0, peakPixels: 0, denoise: [] };

export interface RealServerOptions {
  /** Installed into `<root>/models` (MODELS_DIR) by id. */
  models?: Record<string, ModelSource>;
  /** MODELS_DIR itself, used as it is instead of `<root>/models` (e.g. every reference family). */
  modelsDir?: string;
  /** Required of clients (API_KEYS) and given to `client`; none: loopback only, as without keys. */
  apiKey?: string;
  /** Settings as environment variables, over the test defaults (port 0, no rescans, TEST_SETTINGS). */
  env?: Record<string, string>;
  logger?: Logger;
  /**
   * Memory figures in DATA_DIR as the server starts, as a server that ran before keeps them: by model
   * folder, given MODELS_DIR (where `models` are installed).
   */
  figures?: (modelsDir: string) => Record<string, ModelMemory>;
  /** Reuse a root that has `models/` (restart tests); the caller removes it. */
  root?: string;
  /** The image store's clock (default Date.now): tests move time on instead of waiting. */
  clock?: () => number;
  /** The worker module (default the built one, WORKER_SCRIPT). */
  workerScript?: string;
}

export interface RealServer {
  server: RunningServer;
  client: OpenAI;
  /** The API base URL, ending in /v1. */
  baseURL: string;
  /** Holds `data/` (DATA_DIR) and `models/`. */
  root: string;
  dataDir: string;
  /** Stops the server; removes the root unless it was given. */
  close(): Promise<void>;
}

export async function startRealServer(options: RealServerOptions = {}): Promise<RealServer> {
  const root = options.root ?? (await mkdtemp(path.join(os.tmpdir(), 'imagegen-server-')));
  const modelsDir = options.modelsDir ?? path.join(root, 'models');
  if (!options.modelsDir) await installModels(modelsDir, options.models ?? {});
  const dataDir = path.join(root, 'data');
  const env = {
    ...TEST_SETTINGS,
    PORT: '0',
    DATA_DIR: dataDir,
    MODELS_DIR: modelsDir,
    MODELS_RESCAN_SECONDS: '0',
    ...(options.apiKey && { API_KEYS: options.apiKey }),
    ...options.env,
  };
  const config = loadConfig({}, env);
  if (options.figures) await writeMemoryFigures(config.dataDir, options.figures(modelsDir), config.executionProvider, config.graphRewrites);
  const server = await startServer(config, options.logger ?? silentLogger, { clock: options.clock, workerScript: options.workerScript ?? WORKER_SCRIPT });
  const baseURL = `${server.url}/v1`;
  return {
    server,
    client: new OpenAI({ baseURL, apiKey: options.apiKey ?? 'unused', maxRetries: 0 }),
    baseURL,
    root,
    dataDir,
    async close() {
      await server.close();
      if (!options.root) await rm(root, { recursive: true, force: true });
    },
  };
}
