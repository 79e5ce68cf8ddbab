import { execFile, spawnSync } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import sharp from 'sharp';
import { describe, expect, it, onTestFinished } from 'vitest';
import { imagegenArgs } from './helpers/cli.js';
import { referenceModel } from './helpers/reference.js';
import { largestDifference } from '../src/util/difference.js';

/**
 * EXECUTION_PROVIDER=webgpu, through the real `imagegen generate` in its own process (a provider that
 * failed stays failed for the rest of its process). With no GPU, Mesa's software Vulkan driver
 * (lavapipe, Mesa 25 or later: .ci/run installs it) gives WebGPU an adapter; without one, the
 * generation tests skip and say so, and the fallback test runs either way.
 */

const run = promisify(execFile);
const root = path.resolve(import.meta.dirname, '..');

const PROBE_TIMEOUT_MS = 180_000;

/** Why WebGPU has no adapter here, or undefined when it has one: one session made in a child process. */
function noAdapter(): string | undefined {
  const graph = path.join(referenceModel('sd15-optimum'), 'vae_decoder', 'model.onnx');
  const probe = `const ort = require('onnxruntime-node'); ort.InferenceSession.create(${JSON.stringify(graph)}, { executionProviders: ['webgpu'] }).then(() => process.exit(0), (e) => { console.error(String(e.message).split('\\n')[0]); process.exit(1); });`;
  // Generous: on a busy machine (the rest of the suite runs beside it) lavapipe's first session took over a minute.
  const attempt = () => spawnSync(process.execPath, ['-e', probe], { cwd: root, encoding: 'utf8', timeout: PROBE_TIMEOUT_MS });
  let result = attempt();
  // Once, on a machine the rest of the suite kept busy, the probe crashed (SIGSEGV in the driver) where
  // the same probe alone made its session: a crash is tried once more before the tests skip.
  const crashed = () => result.signal !== null && (result.error as NodeJS.ErrnoException | undefined)?.code !== 'ETIMEDOUT';
  if (crashed()) result = attempt();
  if (result.status === 0) return undefined;
  if (crashed()) return `the probe crashed twice (${result.signal}): ${(result.stderr.trim().split('\n').at(-1) ?? '').slice(-200)}`;
  if (result.signal) return `the probe was stopped after ${PROBE_TIMEOUT_MS / 1000} s without an answer`;
  return (result.stderr.trim().split('\n').at(-1) ?? 'no answer').slice(-200);
}

const missing = noAdapter();
if (missing) console.warn(`skipping the WebGPU generation tests: no WebGPU adapter here (${missing}); install Mesa 25's mesa-vulkan-drivers or a GPU's Vulkan driver`);

/** One image of the demo model with `env`: its file's bytes, its pixels and what the command wrote to stderr. */
async function generate(env: Record<string, string>) {
  const out = await mkdtemp(path.join(os.tmpdir(), 'imagegen-webgpu-'));
  // The memory figures the run measures, kept out of the checkout's ./data.
  const dataDir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-webgpu-data-'));
  for (const dir of [out, dataDir]) onTestFinished(() => rm(dir, { recursive: true, force: true }));
  const { stderr } = await run(process.execPath, imagegenArgs('generate', 'a red circle', '--seed', '7', '--steps', '2', '--out', out), {
    cwd: root,
    // Dawn's Vulkan loader logs an error for each adapter it tries without XDG_RUNTIME_DIR (harmless, but noise).
    env: { ...process.env, XDG_RUNTIME_DIR: os.tmpdir(), DATA_DIR: dataDir, ...env },
    timeout: 240_000,
  });
  const [name] = await readdir(out);
  const file = await readFile(path.join(out, name));
  return { file, pixels: await sharp(file).raw().toBuffer(), stderr };
}

describe('EXECUTION_PROVIDER=webgpu', () => {
  it('runs on the CPU, saying why and what to do, where WebGPU finds no adapter', { timeout: 300_000 }, async () => {
    // No Vulkan driver at all: the loader finds none of the files these name.
    const none = { EXECUTION_PROVIDER: 'webgpu', VK_DRIVER_FILES: '/nonexistent/icd.json', VK_ICD_FILENAMES: '/nonexistent/icd.json' };
    const [fallback, cpu] = await Promise.all([generate(none), generate({ EXECUTION_PROVIDER: 'cpu' })]);
    expect(fallback.stderr).toMatch(/WebGPU execution provider unavailable \(.*adapter.*\); running on CPU\. Install the GPU's driver \(on Linux its Vulkan driver/);
    // Said once, not for each of the model's sessions.
    expect(fallback.stderr.match(/execution provider unavailable/g)).toHaveLength(1);
    expect(fallback.file.equals(cpu.file)).toBe(true);
  });

  it.skipIf(missing)('draws the same picture as the CPU, within two levels', { timeout: 300_000 }, async () => {
    const [gpu, cpu] = await Promise.all([generate({ EXECUTION_PROVIDER: 'webgpu' }), generate({ EXECUTION_PROVIDER: 'cpu' })]);
    expect(gpu.stderr).not.toMatch(/unavailable/);
    // Another provider's arithmetic: not the CPU's picture byte for byte (that would mean it never left the CPU).
    expect(gpu.file.equals(cpu.file)).toBe(false);
    expect(gpu.pixels.length).toBe(cpu.pixels.length);
    // Mesa 25's lavapipe: 1 (float sums in another order, rounded to 8 bits).
    expect(largestDifference(gpu.pixels, cpu.pixels)).toBeLessThanOrEqual(2);
  });
});
