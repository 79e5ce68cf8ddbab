import { mkdtemp } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Logger } from 'pino';
import { expect } from 'vitest';
import type { ErrorBody, ImagesResponse } from '../../src/api/wire.js';
import type { RunningServer } from '../../src/server.js';
import { installModels, startRealServer, type ModelSource, type RealServer } from './real-server.js';
import { referenceModel } from './reference.js';

/**
 * The whole service as `imagegen serve` runs it (worker processes, real pipelines), for the operations
 * tests: one model, `shapes` (the reference SD-Turbo), with small sizes so generations are quick and
 * the step count (`steps`, up to 150) makes one as long as a test needs.
 */

export const MODEL = 'shapes';
export const OPS_KEY = 'sk-ops-0123456789abcdef';
export const auth = { authorization: `Bearer ${OPS_KEY}` };

const shapes = (): ModelSource => ({ copy: referenceModel('sd-turbo'), preset: { sizes: ['128x128', '256x256', '512x512', '1024x1024'], default_size: '128x128' } });

/** A root folder with `models/shapes`; `data/` is the DATA_DIR the servers use. */
export async function makeRoot(): Promise<string> {
  const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-ops-'));
  await installModels(path.join(root, 'models'), { [MODEL]: shapes() });
  return root;
}

/** The environment that points the server at a root made by makeRoot. */
export function rootEnv(root: string): Record<string, string> {
  return { API_KEYS: OPS_KEY, DATA_DIR: path.join(root, 'data'), MODELS_DIR: path.join(root, 'models'), DEFAULT_MODEL: MODEL, MODELS_RESCAN_SECONDS: '0' };
}

export type OpsServer = RealServer;

export interface OpsServerOptions {
  /** Settings as environment variables, over the test defaults (one worker, port 0). */
  env?: Record<string, string>;
  logger?: Logger;
  /** Reuse a root (restart tests); the caller removes it. */
  root?: string;
  /** The image store's clock (see RealServerOptions.clock). */
  clock?: () => number;
}

export function startOpsServer({ env = {}, logger, root, clock }: OpsServerOptions = {}): Promise<OpsServer> {
  return startRealServer({ root, models: root ? {} : { [MODEL]: shapes() }, apiKey: OPS_KEY, logger, clock, env: { WORKERS: '1', DEFAULT_MODEL: MODEL, ...env } });
}

export interface Answer {
  status: number;
  headers: Headers;
  /** The answer's body: images, or an error (the wire types, either half absent). */
  body: Partial<ImagesResponse> & Partial<ErrorBody>;
}

/** POSTs a generation (model `shapes`, the smallest size, 4 steps unless `fields` say otherwise). */
export async function generate(baseURL: string, fields: Record<string, unknown> = {}, init: RequestInit = {}): Promise<Answer> {
  const res = await fetch(`${baseURL}/images/generations`, {
    method: 'POST',
    headers: { ...auth, 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: 'a red circle', steps: 4, response_format: 'b64_json', ...fields }),
    ...init,
  });
  return { status: res.status, headers: res.headers, body: await res.json() };
}

/**
 * A generation that keeps one worker busy for seconds on a 2-core machine, idle or not (the tests that
 * use it need it to outlast a 1 s queue timeout; 512x512 took under a second once threads stopped spinning).
 */
export const LONG = { size: '1024x1024', n: 2, steps: 150 } as const;

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves once /ready answers 200: the workers are up and have loaded the default model. */
export async function untilReady(origin: string, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while ((await fetch(`${origin}/ready`)).status !== 200) {
    if (Date.now() > deadline) throw new Error(`${origin} did not become ready within ${timeoutMs} ms`);
    await sleep(20);
  }
}

/** Waits until the engine runs a job (the long one just sent), its worker started first if need be (a loaded machine takes its time). */
export async function whenRunning(server: RunningServer): Promise<void> {
  await expect.poll(() => server.engine.load().running, { timeout: 60_000, interval: 5 }).toBe(1);
}

/** One series' value in Prometheus text, e.g. `imagegen_denoising_steps_total{model="shapes"}`; undefined when absent. */
export function metric(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

/** /metrics of the server at `origin`, asked with `key` (the ops server's by default). */
export async function scrape(origin: string, key = OPS_KEY): Promise<string> {
  const res = await fetch(`${origin}/metrics`, { headers: { authorization: `Bearer ${key}` } });
  expect(res.status).toBe(200);
  return res.text();
}
