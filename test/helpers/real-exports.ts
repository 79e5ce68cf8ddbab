import { existsSync } from 'node:fs';
import { chmod, cp, mkdtemp, readdir, rm, symlink } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ImageGenerateParamsNonStreaming, ImagesResponse } from 'openai/resources/images';
import { onTestFinished } from 'vitest';
import { WorkerRuntime } from '../../src/pipelines/run.js';
import { startRealServer, UNMEASURED, type RealServer } from './real-server.js';
import { TEST_SETTINGS } from './test-settings.js';

/**
 * The tiny random-weight Optimum exports of the real architectures and diffusers' goldens for them,
 * in shared/ beside the checkout (see ../shared/data/real-exports/README.md). Tests that need them skip
 * with this reason when they are absent.
 */

const here = path.dirname(fileURLToPath(import.meta.url));
export const REAL_EXPORTS = path.resolve(here, '../../../shared/data/real-exports');
export const GOLDENS = path.join(REAL_EXPORTS, 'goldens');
export const haveRealExports = existsSync(path.join(REAL_EXPORTS, 'exports'));
export const REAL_EXPORT_NAMES = ['sd15', 'sd2v', 'sdxl', 'flux'] as const;
export type RealExportName = (typeof REAL_EXPORT_NAMES)[number];

/**
 * The limit of a test that runs the real exports (SD, SDXL, FLUX on CPU), which only ends a hang: their
 * longest take a minute on an idle 2-core machine, and with its load at 15 SDXL's float16 goldens took
 * 101 s of the default 120 and the default sizes through the server ran past it.
 */
export const REAL_EXPORT_TIMEOUT_MS = 600_000;

if (!haveRealExports) console.warn(`skipping the real-export tests: ${REAL_EXPORTS} (the shared test data) is absent`);

export function realExport(name: RealExportName): string {
  return path.join(REAL_EXPORTS, 'exports', name);
}

export function goldenFile(name: RealExportName): string {
  return path.join(GOLDENS, `${name}.json`);
}

/**
 * A copy of a real export that the running test may change: ONNX files are linked (never written),
 * everything else (configs, tokenizer files) is copied. Deleted when the test ends.
 */
export async function copyOfExport(name: RealExportName): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `imagegen-${name}-`));
  onTestFinished(() => rm(dir, { recursive: true, force: true }));
  const source = realExport(name);
  await cp(source, dir, { recursive: true, filter: (file) => !file.endsWith('.onnx') });
  for (const entry of await readdir(source, { recursive: true })) {
    if (entry.endsWith('.onnx')) await symlink(path.join(source, entry), path.join(dir, entry));
    // shared/ is read-only and cp keeps modes: the copies must be writable for the test to change them.
    else await chmod(path.join(dir, entry), 0o755);
  }
  return dir;
}

/**
 * A runtime in this process for the exports' cases, with one model loaded at a time (a budget of one
 * byte) and the intra-op threads of the servers tests start (TEST_SETTINGS): the file vitest runs beside
 * this one takes the other core.
 */
export const exportsRuntime = (): WorkerRuntime =>
  new WorkerRuntime({ runtime: { provider: 'cpu', threads: Number(TEST_SETTINGS.WORKER_THREADS) }, modelMemoryBudget: 1 });

/** `runtime` holds UNMEASURED figures for these model folders: it does not calibrate them as they load. */
export function skipCalibration(runtime: WorkerRuntime, ...modelDirs: string[]): void {
  for (const dir of modelDirs) runtime.adoptMemory(dir, UNMEASURED);
}

export interface ExportsServer extends RealServer {
  /** One image, b64_json, 1 step unless `params` say otherwise (extension fields included). */
  generate(params: Record<string, unknown>): Promise<ImagesResponse>;
}

/**
 * The whole server (worker processes, real pipelines) with the named real exports installed beside the
 * embedded model, one worker, and the official client pointed at it. `calibrate: false`: they start
 * with UNMEASURED figures in DATA_DIR.
 */
export async function startExportsServer(names: readonly RealExportName[], env: Record<string, string> = {}, { calibrate = true } = {}): Promise<ExportsServer> {
  const real = await startRealServer({
    models: Object.fromEntries(names.map((name) => [name, { link: realExport(name) }])),
    env: { WORKERS: '1', ...env },
    ...(!calibrate && { figures: (modelsDir: string) => Object.fromEntries(names.map((name) => [path.resolve(modelsDir, name), UNMEASURED])) }),
  });
  return {
    ...real,
    generate: (params) =>
      real.client.images.generate({ prompt: 'a red circle', response_format: 'b64_json', steps: 1, ...params } as unknown as ImageGenerateParamsNonStreaming),
  };
}
