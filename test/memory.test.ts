import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readMemoryFigures } from '../src/models/memory-figures.js';
import { MemoryPlan, vaeAttentionBytes } from '../src/pipelines/memory-plan.js';
import { WorkerRuntime } from '../src/pipelines/run.js';
import { metric } from './helpers/ops-server.js';
import { haveRealExports, realExport, startExportsServer, type ExportsServer } from './helpers/real-exports.js';

/**
 * Memory planned from what models really take: measured in the worker, kept, shown, and used to refuse
 * a batch that would not fit with an error that says what to change (never an OOM kill).
 */

const withAttention = { dir: '/m', vae: { scalingFactor: 0.18215, shiftFactor: 0, scaleFactor: 8, midBlockAttention: true } };

describe('the memory plan', () => {
  it("estimates the VAE's attention from the latent pixels, and nothing for a decoder without attention", () => {
    // 1024x1024 -> 128x128 = 16384 tokens: three float32 16384x16384 matrices.
    expect(vaeAttentionBytes(withAttention, 1024, 1024)).toBe(3 * 16384 ** 2 * 4);
    expect(vaeAttentionBytes({ vae: { ...withAttention.vae, midBlockAttention: false } }, 1024, 1024)).toBe(0);
  });

  it('plans with the measured peak scaled by pixels when that is larger than the attention', () => {
    const plan = new MemoryPlan({ '/m': { weightsBytes: 1e9, peakBytes: 1e9, peakPixels: 512 * 512 } });
    const items = (n: number) => Array.from({ length: n }, (_, seed) => ({ prompt: '', negativePrompt: '', seed }));
    expect(plan.estimate(withAttention, { width: 512, height: 512, items: items(1) })).toBe(1e9);
    expect(plan.estimate(withAttention, { width: 512, height: 512, items: items(2) })).toBe(2e9);
    // 16x the pixels: 16 GB by the measurement, 51.5 GB by the attention's square.
    expect(plan.estimate(withAttention, { width: 2048, height: 2048, items: items(1) })).toBe(vaeAttentionBytes(withAttention, 2048, 2048));
  });

  it('splits a batch into the most images per model call that fit', () => {
    // 1 GB per 512x512 image measured; 2.5 GB allowed (less the headroom): two at a time.
    const plan = new MemoryPlan({ '/m': { weightsBytes: 1e9, peakBytes: 1e9, peakPixels: 512 * 512 } }, 2.5e9);
    const items = Array.from({ length: 4 }, (_, seed) => ({ prompt: '', negativePrompt: '', seed }));
    expect(plan.imagesPerRun(withAttention, { width: 512, height: 512, items }, 'm')).toBe(2);
    expect(plan.imagesPerRun(withAttention, { width: 512, height: 512, items: items.slice(0, 1) }, 'm')).toBe(1);
  });

  it('refuses a batch when not one image fits, naming the model, the size, the need and the settings to change', () => {
    const plan = new MemoryPlan({}, 100 * 2 ** 20);
    expect(() => plan.imagesPerRun(withAttention, { width: 1024, height: 1024, items: [{ prompt: '', negativePrompt: '', seed: 1 }] }, 'sdxl')).toThrow(
      /^Model 'sdxl' needs about 3\.0 GiB of memory to make an image of 1024x1024 and 100\.0 MiB is free within MEMORY_LIMIT\. .*WORKERS.*MEMORY_LIMIT/,
    );
  });

  it.skipIf(!haveRealExports)('measures what a real export takes in this process, loaded and at its peak (needs ../shared)', async () => {
    const runtime = new WorkerRuntime({ runtime: { provider: 'cpu', threads: 1 } });
    const dir = realExport('sd15');
    await runtime.generateImages({ modelDir: dir, width: 512, height: 512, steps: 1, guidanceScale: 0, items: [{ prompt: 'a cat', negativePrompt: '', seed: 1 }] });
    const measured = runtime.modelMemory(dir)!;
    expect(measured.weightsBytes).toBeGreaterThan(1e6);
    // At least the VAE's attention at 512x512 (4096 tokens) passes through memory.
    expect(measured.peakBytes).toBeGreaterThan(4096 ** 2 * 4);
    expect(measured.peakPixels).toBe(512 * 512);
  });
});

describe('memory in the server', () => {
  let exports: ExportsServer;
  beforeAll(async () => {
    // 12m (10.8 MiB to plan with): less than the sd15 VAE's smallest decode tile needs (12 MiB of
    // attention for 32x32 latent pixels), more than the demo model's measured need at 256x256 (about 9.5 MiB).
    exports = await startExportsServer(haveRealExports ? ['sd15'] : [], { MEMORY_LIMIT: '12m', METRICS_PUBLIC: 'true' });
  });
  afterAll(() => exports?.close());
  const generate = (params: Record<string, unknown>) => exports.generate(params);

  it('measures each model in its worker, shows it in /metrics and keeps it in DATA_DIR', async () => {
    await generate({ model: 'demo-shapes', size: '256x256' });
    const text = await (await fetch(`${exports.server.url}/metrics`)).text();
    expect(metric(text, 'imagegen_model_memory_bytes{model="demo-shapes",kind="weights"}')).toBeGreaterThan(0);
    expect(metric(text, 'imagegen_model_memory_bytes{model="demo-shapes",kind="peak"}')).toBeGreaterThan(0);
    await expect.poll(async () => Object.keys(await readMemoryFigures(exports.dataDir))).toEqual([expect.stringMatching(/demo-shapes$/)]);
  });

  it.skipIf(!haveRealExports)('answers a batch that would not fit with 507 insufficient_memory, and keeps serving (needs ../shared)', async () => {
    const error = await generate({ model: 'sd15', size: '512x512' }).catch((err: unknown) => err);
    expect(error).toBeInstanceOf(OpenAI.APIError);
    const { status, error: body } = error as InstanceType<typeof OpenAI.APIError>;
    expect(status).toBe(507);
    expect(body).toMatchObject({ code: 'insufficient_memory', message: expect.stringMatching(/^Model 'sd15' needs about .* of 512x512 .*MEMORY_LIMIT/) });
    expect((await generate({ model: 'demo-shapes', size: '256x256' })).data).toHaveLength(1);
  });
});
