import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readdir, rm, utimes, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bytesPerImage, leastPerImage, mergeSamples } from '../src/models/memory-curve.js';
import { MemoryFigures, openKeptFigures, readMemoryFigures, writeMemoryFigures } from '../src/models/memory-figures.js';
import { localMemory, MemoryPlan, vaeAttentionBytes } from '../src/pipelines/memory-plan.js';
import { WorkerRuntime } from '../src/pipelines/run.js';
import { imagegenArgs, PROJECT_ROOT } from './helpers/cli.js';
import { DEMO_MODEL_DIR } from './helpers/demo-model.js';
import { metric } from './helpers/ops-server.js';
import { haveRealExports, REAL_EXPORT_TIMEOUT_MS, realExport, startExportsServer, type ExportsServer } from './helpers/real-exports.js';
import { startRealServer, type RealServer } from './helpers/real-server.js';
import { killServer, spawnServer, type ServerProcess } from './helpers/server-process.js';

/**
 * Memory planned from what models really take: measured in the worker, kept, shown, and used to refuse
 * a batch that would not fit with an error that says what to change (never an OOM kill).
 */

const withAttention = { dir: '/m', vae: { scalingFactor: 0.18215, shiftFactor: 0, scaleFactor: 8, midBlockAttention: true }, denoiserConfig: {} };

describe('the memory plan', () => {
  it("estimates the VAE's attention from the latent pixels, and nothing for a decoder without attention", () => {
    // 1024x1024 -> 128x128 = 16384 tokens: three float32 16384x16384 matrices.
    expect(vaeAttentionBytes(withAttention, 1024, 1024)).toBe(3 * 16384 ** 2 * 4);
    expect(vaeAttentionBytes({ vae: { ...withAttention.vae, midBlockAttention: false } }, 1024, 1024)).toBe(0);
  });

  const items = (n: number) => Array.from({ length: n }, (_, seed) => ({ prompt: '', negativePrompt: '', seed }));
  const attention = (side: number) => vaeAttentionBytes(withAttention, side, side);
  // Measured at 512x512: 1 GB denoising one image, 0.3 GB in one decoder call (its attention included).
  const measured = { weightsBytes: 1e9, peakBytes: 1.3e9, peakPixels: 512 * 512, denoise: [{ pixels: 512 * 512, bytes: 1e9 }], decode: { bytes: 3e8, pixels: 512 * 512, attentionBytes: attention(512) } };

  it('plans a batch as its denoising per image times the images plus one decoder call, whose attention grows with the square', () => {
    const plan = new MemoryPlan({ '/m': measured });
    expect(plan.estimate(withAttention, { width: 512, height: 512, items: items(1) }, Infinity)).toBeCloseTo(1.3e9, -3);
    expect(plan.estimate(withAttention, { width: 512, height: 512, items: items(2) }, Infinity)).toBeCloseTo(2.3e9, -3);
    // The figures are per sample of a denoiser call: with classifier-free guidance an image is two.
    expect(plan.estimate(withAttention, { width: 512, height: 512, items: items(1) }, Infinity, 2)).toBeCloseTo(2.3e9, -3);
    // 4x the pixels from one sample: the denoising bounded by the square (x16), the decoder's convolutions x4, its attention exact.
    expect(plan.estimate(withAttention, { width: 1024, height: 1024, items: items(1) }, Infinity)).toBeCloseTo(16e9 + (3e8 - attention(512)) * 4 + attention(1024), -3);
    // A model never measured: the decoder's attention alone, all that is known in closed form.
    expect(new MemoryPlan().estimate(withAttention, { width: 512, height: 512, items: items(2) }, Infinity)).toBe(attention(512));
  });

  it("plans the VAE encoder, which encodes each picture whole though the decoder tiles: image-to-image's, and an inpainting model's for text-to-image", () => {
    // A small denoiser beside a large VAE, as in the tiny real exports: at 1024x1024 the decoder tiles
    // within a 2 GB budget, but the encoder's attention over all 16384 latent pixels is 3.2 GB by itself.
    const plan = new MemoryPlan({ '/m': { ...measured, denoise: [{ pixels: 512 * 512, bytes: 1e7 }] } });
    plan.vaeTiler(withAttention);
    const picture = { width: 1024, height: 1024, pixels: new Uint8Array(1024 * 1024 * 3) };
    const textToImage = plan.estimate(withAttention, { width: 1024, height: 1024, items: items(1) }, 2e9);
    const imageToImage = plan.estimate(withAttention, { width: 1024, height: 1024, items: items(1).map((item) => ({ ...item, image: picture })) }, 2e9);
    // Text to image fits, in tiles; image to image does not: its encoder takes a whole decoder call's memory.
    expect(textToImage).toBeLessThanOrEqual(2e9);
    expect(imageToImage).toBeCloseTo((3e8 - attention(512)) * 4 + attention(1024), -3);
    expect(imageToImage).toBeGreaterThan(2e9);

    // An inpainting UNet (9 input channels) has its encoder encode a blank picture for each text-to-image item.
    const inpainting = { ...withAttention, denoiserConfig: { in_channels: 9 }, vaeEncoder: 'vae_encoder/model.onnx' };
    expect(plan.estimate(inpainting, { width: 1024, height: 1024, items: items(1) }, 2e9)).toBe(imageToImage);
    // One without an encoder runs none (its masked picture's latents are zeros).
    expect(plan.estimate({ ...inpainting, vaeEncoder: undefined }, { width: 1024, height: 1024, items: items(1) }, 2e9)).toBe(textToImage);
  });

  it('extrapolates the denoising as the larger of the square from the largest size and twice the fitted a·p + b·p²', () => {
    const [p1, p2] = [256 * 256, 512 * 512];
    // All square (x16 for 4x the pixels): the fitted curve is the square, doubled for the arena.
    expect(bytesPerImage([{ pixels: p1, bytes: 1e8 }, { pixels: p2, bytes: 16e8 }], 4 * p2)).toBeCloseTo(2 * 256e8, -3);
    // All linear: the square from the larger sample, above twice the line.
    expect(bytesPerImage([{ pixels: p1, bytes: 1e8 }, { pixels: p2, bytes: 4e8 }], 4 * p2)).toBeCloseTo(64e8, -3);
    // Steeper than the square between the samples (an arena doubling): twice the fitted curve.
    expect(bytesPerImage([{ pixels: p1, bytes: 1e8 }, { pixels: p2, bytes: 32e8 }], 2 * p2)).toBeGreaterThan(32e8 * 4);
    // Below the largest sample: that sample's bound, linear.
    expect(bytesPerImage([{ pixels: p1, bytes: 1e8 }, { pixels: p2, bytes: 4e8 }], p2 / 2)).toBeCloseTo(2e8, -3);
    expect(bytesPerImage([], p2)).toBe(0);
    // Merged figures keep the larger per size, sorted, at most `keep` sizes (the largest).
    expect(mergeSamples([{ pixels: p2, bytes: 2 }, { pixels: p1, bytes: 5 }], [{ pixels: p2, bytes: 3 }, { pixels: 4 * p2, bytes: 1 }], 2)).toEqual([
      { pixels: p2, bytes: 3 },
      { pixels: 4 * p2, bytes: 1 },
    ]);
  });

  it('expects at least what an image was seen to exceed, at that size and above (a run onnxruntime could not allocate)', () => {
    const p = 512 * 512;
    expect(leastPerImage([{ pixels: p, bytes: 4e9 }], p / 2)).toBe(0);
    expect(leastPerImage([{ pixels: p, bytes: 4e9 }], p)).toBeGreaterThan(4e9);
    expect(leastPerImage([{ pixels: p, bytes: 4e9 }, { pixels: 2 * p, bytes: 6e9 }], 4 * p)).toBeGreaterThan(6e9);
    const plan = new MemoryPlan({ '/m': { ...measured, exceeded: [{ pixels: p, bytes: 4e9 }] } });
    expect(plan.estimate(withAttention, { width: 512, height: 512, items: items(1) }, Infinity)).toBeGreaterThan(4e9);
    expect(plan.estimate(withAttention, { width: 256, height: 256, items: items(1) }, Infinity)).toBeLessThan(1e9);
  });

  it("plans with the pool's figures beside its own, each the larger, but not with another version's", () => {
    const plan = new MemoryPlan({ '/m': { ...measured, version: 'a' } });
    plan.adopt('/m', { ...measured, denoise: [{ pixels: 1024 * 1024, bytes: 2e9 }], version: 'a' });
    const own = [{ pixels: 512 * 512, bytes: 1e9 }, { pixels: 1024 * 1024, bytes: 2e9 }];
    expect(plan.of('/m')!.denoise).toEqual(own);
    // Measured of other files in the folder (a model replaced under its id): they say nothing of these.
    plan.adopt('/m', { ...measured, denoise: [{ pixels: 512 * 512, bytes: 9e9 }], version: 'b' });
    expect(plan.of('/m')).toMatchObject({ denoise: own, version: 'a' });
    // A model this plan has no figures of yet: the pool's.
    plan.adopt('/n', measured);
    expect(plan.of('/n')).toEqual(measured);
  });

  it("plans a version it loads with the pool's figures of that version, though it held another's when they came", async () => {
    // A folder replaced under its id (pull --force) while this worker held the old files' figures: the
    // pool's of the new files, set aside as they came, were lost when it loaded them, and it planned
    // from its own calibration alone (the pool's larger sizes and OOM lessons unknown to it).
    const plan = new MemoryPlan({ '/m': { ...measured, version: 'a' } });
    const pooled = { ...measured, denoise: [{ pixels: 1024 * 1024, bytes: 3e9 }], exceeded: [{ pixels: 1024 * 1024, bytes: 4e9 }], version: 'b' };
    plan.adopt('/m', pooled);
    await plan.measureLoad('/m', 'b', async () => undefined);
    expect(plan.of('/m')).toMatchObject({ denoise: pooled.denoise, exceeded: pooled.exceeded, version: 'b' });
  });

  it('splits a batch into the most images per model call that fit', async () => {
    // 1 GB denoising per 512x512 image and 0.3 GB to decode; 3.5 GB allowed, less the headroom (3.15 GB): two at a time.
    const plan = new MemoryPlan({ '/m': measured }, localMemory(3.5e9));
    expect(await plan.imagesPerRun(withAttention, { width: 512, height: 512, items: items(4) }, 'm')).toBe(2);
    expect(await plan.imagesPerRun(withAttention, { width: 512, height: 512, items: items(1) }, 'm')).toBe(1);
  });

  it('refuses a batch when not one image fits, naming the model, the size, the need and the settings to change', async () => {
    const plan = new MemoryPlan({}, localMemory(100 * 2 ** 20));
    await expect(plan.imagesPerRun(withAttention, { width: 1024, height: 1024, items: items(1) }, 'sdxl')).rejects.toThrow(
      /^Model 'sdxl' needs about 3\.0 GiB of memory to make an image of 1024x1024 and batches may plan on 90\.0 MiB now .*WORKERS.*MEMORY_LIMIT/,
    );
  });

  it.skipIf(process.platform !== 'linux')("counts an image-to-image batch's denoising from the end of its encoding, not the encoder's memory with it (Linux: a resettable peak)", async () => {
    const plan = new MemoryPlan();
    const held: Buffer[] = [];
    const MiB = 2 ** 20;
    await plan.measureRun('/m', 1, 512 * 512, async () => {
      // The encoder's session and attention: 200 MiB before the pictures are encoded.
      held.push(Buffer.alloc(200 * MiB, 1));
      plan.encoded();
      // The denoising: 40 MiB more.
      held.push(Buffer.alloc(40 * MiB, 1));
    });
    const [denoise] = plan.of('/m')!.denoise!;
    expect(denoise.bytes).toBeGreaterThan(30 * MiB);
    expect(denoise.bytes).toBeLessThan(100 * MiB);
    // The batch's peak still counts the encoder's (240 MiB held; without the encoder's 200 it would be
    // about 40: the margin leaves room for what the collector frees meanwhile on a loaded machine).
    expect(plan.of('/m')!.peakBytes).toBeGreaterThan(150 * MiB);
    held.length = 0;
  });

  it.skipIf(process.platform !== 'linux')('does not count what a larger run left held as the need of a smaller run after it (Linux: a resettable peak)', async () => {
    // Under mixed traffic a worker's 512x512 run after its 1024x1024 batches recorded their 155 MiB
    // left resident as its own (83 MiB a sample, 23 on its own): the curve then planned 4 GiB for one
    // 1024x1024 image, and the server answered every such request 507 from then on.
    const plan = new MemoryPlan();
    const held: Buffer[] = [];
    const MiB = 2 ** 20;
    const keep = (mib: number) => async () => void held.push(Buffer.alloc(mib * MiB, 1));
    await plan.measureLoad('/m', undefined, async () => undefined);
    // Four samples of 1024x1024: 200 MiB, left held (an arena keeps them; so do the allocator and the heap).
    await plan.measureRun('/m', 4, 1024 * 1024, keep(200));
    // One sample of 512x512 that grew 20 MiB beyond them: it needed no more than 220, and maybe little of it.
    await plan.measureRun('/m', 1, 512 * 512, keep(20));
    const perSample = (side: number) => plan.of('/m')!.denoise!.find((sample) => sample.pixels === side * side)?.bytes;
    expect(perSample(1024)).toBeGreaterThan(40 * MiB);
    expect(perSample(512)).toBeUndefined();
    // A run the earlier ones may not have held room for (one sample of 1536x1536: fewer pixels than the
    // four of 1024x1024, but more of their squares, the attention's) still measures its need, the held memory with it.
    await plan.measureRun('/m', 1, 1536 * 1536, keep(150));
    expect(perSample(1536)).toBeGreaterThan(300 * MiB);
    held.length = 0;
  });

  it.skipIf(!haveRealExports)('measures what a real export takes in this process, loaded and at its peak (needs ../shared)', async () => {
    // Graphs rewritten only where exact: the unfused attention's scores grow the denoiser's arena at each
    // larger size, which the three samples below rely on; fused, a larger size can fit in what the
    // smaller one left, and is then not sampled.
    const runtime = new WorkerRuntime({ runtime: { provider: 'cpu', threads: 1, graphRewrites: 'exact' } });
    const dir = realExport('sd15');
    await runtime.generateImages({ modelDir: dir, width: 512, height: 512, steps: 1, guidanceScale: 2, items: [{ prompt: 'a cat', negativePrompt: '', seed: 1 }] });
    const measured = runtime.modelMemory(dir)!;
    // Guidance above 1 doubles each image in the UNet's batch: memory is counted per sample.
    const pipeline = await runtime.getPipeline(dir);
    expect([pipeline.samplesPerImage({ guidanceScale: 2 }), pipeline.samplesPerImage({ guidanceScale: 1 }), pipeline.samplesPerImage({ guidanceScale: 0 })]).toEqual([2, 1, 1]);
    expect(measured.weightsBytes).toBeGreaterThan(1e6);
    // At least the VAE's attention at 512x512 (4096 tokens) passes through memory.
    expect(measured.peakBytes).toBeGreaterThan(4096 ** 2 * 4);
    // Two samples of 512x512: the image and, with guidance, its unconditional copy.
    expect(measured.peakPixels).toBe(2 * 512 * 512);
    // On Linux the peak is measured in its two phases, the decoder's with its attention at 512x512.
    if (process.platform === 'linux') {
      // Its calibration runs (1/2 and 3/4 of its native 512: 256 and 384, one step each, with guidance) and the batch, which grew the
      // denoiser's arena beyond what they left: three sizes of denoising.
      expect(measured.denoise!.map((sample) => sample.pixels)).toEqual([256 * 256, 384 * 384, 512 * 512]);
      // The largest decoder call seen (the allocator's reuse of freed pages blurs which of the three
      // sizes), with the attention of its own size.
      const decode = measured.decode!;
      expect([256 * 256, 384 * 384, 512 * 512]).toContain(decode.pixels);
      expect(decode.attentionBytes).toBe(vaeAttentionBytes(withAttention, Math.sqrt(decode.pixels), Math.sqrt(decode.pixels)));
      expect(decode.bytes).toBeGreaterThan(0);
    }
  });
});

describe('memory in the server', () => {
  let exports: ExportsServer;
  beforeAll(async () => {
    // 64m (57.6 MiB to plan with): far more than the demo model takes at 256x256 (about 13 MiB), far
    // less than the sdxl export's calibration runs show it needs at 1024x1024 (about 500 MiB; the sd15
    // export's 512x512, with its attention fused, needs too little beside the 64m MEMORY_LIMIT allows
    // at least).
    exports = await startExportsServer(haveRealExports ? ['sdxl'] : [], { MEMORY_LIMIT: '64m', METRICS_PUBLIC: 'true' });
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
    const error = await generate({ model: 'sdxl', size: '1024x1024' }).catch((err: unknown) => err);
    expect(error).toBeInstanceOf(OpenAI.APIError);
    const { status, error: body } = error as InstanceType<typeof OpenAI.APIError>;
    expect(status).toBe(507);
    expect(body).toMatchObject({ code: 'insufficient_memory', message: expect.stringMatching(/^Model 'sdxl' needs about .* of 1024x1024 .*MEMORY_LIMIT/) });
    expect((await generate({ model: 'demo-shapes', size: '256x256' })).data).toHaveLength(1);
  });
});

describe('figures kept from earlier runs', () => {
  let root: string;
  let server: ServerProcess;
  /** More than the demo model's load grows a worker by (about 25 MiB), as a run on a busier machine measured. */
  const keptWeights = 256 * 2 ** 20;
  const [killedWrite, writeUnderWay] = ['model-memory.json.4321-0.tmp', 'model-memory.webgpu.exact.json.4322-7.tmp'];
  beforeAll(async () => {
    root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-kept-figures-'));
    const dataDir = path.join(root, 'data');
    await writeMemoryFigures(dataDir, { [DEMO_MODEL_DIR]: { weightsBytes: keptWeights, peakBytes: 2 ** 20, peakPixels: 256 * 256 } });
    // What a writer killed between its write and its rename left an hour ago, and one another process is writing now.
    await writeFile(path.join(dataDir, killedWrite), '{"version": 6, "models": {');
    await utimes(path.join(dataDir, killedWrite), new Date(Date.now() - 3600_000), new Date(Date.now() - 3600_000));
    await writeFile(path.join(dataDir, writeUnderWay), '{"version": 6, "models": {');
    server = await spawnServer({ PORT: '0', DATA_DIR: dataDir, MODELS_DIR: path.join(root, 'models'), MODELS_RESCAN_SECONDS: '0' });
  });
  afterAll(async () => {
    if (server) await killServer(server);
    if (root) await rm(root, { recursive: true, force: true });
  });

  it('are what /metrics shows, as `imagegen models list` and the memory plan use them, not what the last worker to load the model measured', async () => {
    // Before, the gauge showed the loading worker's own growth: a model loaded second in a worker, or by
    // a replacement, read a fraction of what the server plans with and keeps.
    const weights = async () => metric(await (await fetch(`${server.origin}/metrics`)).text(), 'imagegen_model_memory_bytes{model="demo-shapes",kind="weights"}');
    await expect.poll(weights, { timeout: 30_000 }).toBeDefined();
    const kept = (await readMemoryFigures(path.join(root, 'data')))[DEMO_MODEL_DIR];
    expect(kept.weightsBytes).toBe(keptWeights);
    expect(await weights()).toBe(kept.weightsBytes);
  });

  it('are rid of the file a writer killed between its write and its rename left, and not of one being written now', async () => {
    // Left, each such file stayed in DATA_DIR for good.
    const left = (await readdir(path.join(root, 'data'))).filter((name) => name.endsWith('.tmp'));
    expect(left).toEqual([writeUnderWay]);
  });
});

describe('figures kept by an older version', () => {
  let root: string;
  let server: ServerProcess;
  beforeAll(async () => {
    // A version-1 file (a bare record of models, figures per image) saying the demo model needs 1 TiB to
    // denoise one 512x512 image: were it read, every request would get 507.
    root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-old-figures-'));
    const dataDir = path.join(root, 'data');
    await mkdir(dataDir);
    const TiB = 2 ** 40;
    await writeFile(path.join(dataDir, 'model-memory.json'), JSON.stringify({ [DEMO_MODEL_DIR]: { weightsBytes: 2 ** 20, peakBytes: TiB, peakPixels: 512 * 512, denoise: [{ pixels: 512 * 512, bytes: TiB }] } }));
    server = await spawnServer({ PORT: '0', DATA_DIR: dataDir, MODELS_DIR: path.join(root, 'models'), MODELS_RESCAN_SECONDS: '0' });
  });
  afterAll(async () => {
    if (server) await killServer(server);
    if (root) await rm(root, { recursive: true, force: true });
  });

  it('are told apart from a file that is missing or damaged', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-figures-'));
    try {
      expect((await MemoryFigures.open(dir)).setAside).toBeUndefined();
      await writeFile(path.join(dir, 'model-memory.json'), '{"version": 6, "models": {"/m": {"weightsBytes": "lots"');
      expect((await MemoryFigures.open(dir)).setAside).toBe('unreadable');
      await writeFile(path.join(dir, 'model-memory.json'), '{"/m": {"weightsBytes": 1, "peakBytes": 1, "peakPixels": 1}}');
      expect((await MemoryFigures.open(dir)).setAside).toBe('outdated');
      // Measured with the attention zeros that graphs no longer have (src/runtime/graph-rewrite.ts).
      await writeFile(path.join(dir, 'model-memory.json'), '{"version": 2, "models": {"/m": {"weightsBytes": 1, "peakBytes": 1, "peakPixels": 1}}}');
      expect((await MemoryFigures.open(dir)).setAside).toBe('outdated');
      // Measured with the attention the CPU now runs fused.
      await writeFile(path.join(dir, 'model-memory.json'), '{"version": 3, "models": {"/m": {"weightsBytes": 1, "peakBytes": 1, "peakPixels": 1}}}');
      expect((await MemoryFigures.open(dir)).setAside).toBe('outdated');
      // Measured with FLUX's attention unfused.
      await writeFile(path.join(dir, 'model-memory.json'), '{"version": 4, "models": {"/m": {"weightsBytes": 1, "peakBytes": 1, "peakPixels": 1}}}');
      expect((await MemoryFigures.open(dir)).setAside).toBe('outdated');
      // Measured counting what larger runs left held as a smaller run's need.
      await writeFile(path.join(dir, 'model-memory.json'), '{"version": 5, "models": {"/m": {"weightsBytes": 1, "peakBytes": 1, "peakPixels": 1}}}');
      expect((await MemoryFigures.open(dir)).setAside).toBe('outdated');
      // Of a newer version (a server rolled back after an upgrade): not damaged, and said so, where it read as a damaged file.
      await writeFile(path.join(dir, 'model-memory.json'), '{"version": 7, "models": {"/m": {"weightsBytes": 1, "peakBytes": 1, "peakPixels": 1, "what": "next"}}}');
      expect((await MemoryFigures.open(dir)).setAside).toBe('newer');
      const said: string[] = [];
      await openKeptFigures(dir, { provider: 'cpu', graphRewrites: 'all' }, { info: (message) => said.push(message), warn: (message) => said.push(message) });
      expect(said).toEqual([expect.stringMatching(/^the memory figures in DATA_DIR\/model-memory\.json were written by a newer version of imagegen, .*measured again/)]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('that cannot be written are said so, and still serve the server that measured them', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-figures-'));
    try {
      const failures: Error[] = [];
      const figures = await MemoryFigures.open(dir, { onWriteError: (err) => failures.push(err) });
      // A folder where the file would go: every write fails, as on a read-only DATA_DIR.
      await mkdir(path.join(dir, 'model-memory.json'));
      figures.record('/m', { weightsBytes: 1, peakBytes: 2, peakPixels: 3 });
      await figures.flushed();
      expect(failures.map((err) => (err as NodeJS.ErrnoException).code)).toEqual(['EISDIR']);
      expect(figures.all()).toEqual({ '/m': { weightsBytes: 1, peakBytes: 2, peakPixels: 3 } });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('are written whole by writers that share DATA_DIR at once (two servers, a server and the CLI): the last one wins', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-figures-'));
    try {
      const figures = (peakBytes: number) => ({ '/m': { weightsBytes: 1, peakBytes, peakPixels: 3 } });
      // Written aside under one name, eight at once failed their renames and could leave a garbled file.
      await Promise.all(Array.from({ length: 8 }, (_, i) => writeMemoryFigures(dir, figures(i + 1))));
      expect((await readMemoryFigures(dir))['/m'].peakBytes).toBeGreaterThan(0);
      expect((await readdir(dir)).filter((name) => name.endsWith('.tmp'))).toEqual([]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('keep what another process sharing DATA_DIR wrote since they were read (a server and `imagegen generate`): neither write drops the other\'s models', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-figures-'));
    try {
      const [server, command] = [await MemoryFigures.open(dir), await MemoryFigures.open(dir)];
      command.record('/measured-by-the-command', { weightsBytes: 1, peakBytes: 2, peakPixels: 3 });
      await command.flushed();
      server.record('/measured-by-the-server', { weightsBytes: 4, peakBytes: 5, peakPixels: 6 });
      server.record('/both', { weightsBytes: 7, peakBytes: 8, peakPixels: 9 });
      await server.flushed();
      command.record('/both', { weightsBytes: 10, peakBytes: 1, peakPixels: 1 });
      await command.flushed();
      expect(await readMemoryFigures(dir)).toEqual({
        '/measured-by-the-command': { weightsBytes: 1, peakBytes: 2, peakPixels: 3 },
        '/measured-by-the-server': { weightsBytes: 4, peakBytes: 5, peakPixels: 6 },
        // Each the most either saw.
        '/both': { weightsBytes: 10, peakBytes: 8, peakPixels: 9 },
      });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("are kept per execution provider and set of graph rewrites: a GPU's figures (host memory only) are never read on the CPU", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-figures-'));
    try {
      const onGpu = await MemoryFigures.open(dir, { provider: 'webgpu' });
      expect(onGpu.fileName).toBe('model-memory.webgpu.json');
      onGpu.record('/m', { weightsBytes: 1, peakBytes: 2, peakPixels: 3 });
      await onGpu.flushed();
      expect(await readMemoryFigures(dir, 'webgpu')).toEqual({ '/m': { weightsBytes: 1, peakBytes: 2, peakPixels: 3 } });
      expect(await readMemoryFigures(dir, 'cpu')).toEqual({});
      expect(await readMemoryFigures(dir, 'cuda')).toEqual({});
      const onCpu = await MemoryFigures.open(dir);
      expect(onCpu.fileName).toBe('model-memory.json');
      onCpu.record('/m', { weightsBytes: 10, peakBytes: 20, peakPixels: 30 });
      await onCpu.flushed();
      // Back on the GPU, its own figures are there as they were.
      expect((await MemoryFigures.open(dir, { provider: 'webgpu' })).all()).toEqual({ '/m': { weightsBytes: 1, peakBytes: 2, peakPixels: 3 } });
      // Graphs rewritten only where exact (unfused attention) take more: their figures are their own too.
      const exact = await MemoryFigures.open(dir, { provider: 'cpu', graphRewrites: 'exact' });
      expect([exact.fileName, (await MemoryFigures.open(dir, { provider: 'webgpu', graphRewrites: 'exact' })).fileName]).toEqual(['model-memory.exact.json', 'model-memory.webgpu.exact.json']);
      expect(exact.all()).toEqual({});
      exact.record('/m', { weightsBytes: 10, peakBytes: 80, peakPixels: 30 });
      await exact.flushed();
      expect((await readMemoryFigures(dir, 'cpu'))['/m'].peakBytes).toBe(20);
      expect((await readMemoryFigures(dir, 'cpu', 'exact'))['/m'].peakBytes).toBe(80);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('are set aside, saying so, and the model is measured again', async () => {
    expect(server.log.some((line) => line.includes('model-memory.json were measured by an older version'))).toBe(true);
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 });
    expect((await client.images.generate({ model: 'demo-shapes', prompt: 'a cat', size: '512x512', response_format: 'b64_json' })).data).toHaveLength(1);
    // The file is rewritten in this version's format with what the worker measured.
    await expect.poll(async () => (await readMemoryFigures(path.join(root, 'data')))[DEMO_MODEL_DIR]?.weightsBytes).toBeGreaterThan(0);
    expect((await readMemoryFigures(path.join(root, 'data')))[DEMO_MODEL_DIR].peakBytes).toBeLessThan(2 ** 40);
  });
});

describe('figures of a model replaced under its id', () => {
  let real: RealServer;
  const execFileAsync = promisify(execFile);
  beforeAll(async () => {
    if (haveRealExports) real = await startRealServer({ models: { main: { copy: realExport('sd15') } }, env: { WORKERS: '1', PRELOAD: 'none' } });
  }, REAL_EXPORT_TIMEOUT_MS);
  afterAll(() => real?.close());

  it.skipIf(!haveRealExports)('are not the replaced model\'s: "models list" says not measured, and the server measures and calibrates it afresh (needs ../shared)', async () => {
    const dir = path.join(real.root, 'models', 'main');
    const generate = (size: '512x512') => real.client.images.generate({ model: 'main', prompt: 'a red circle', size, response_format: 'b64_json', steps: 1 } as OpenAI.ImageGenerateParamsNonStreaming);
    const list = async () => (await execFileAsync(process.execPath, imagegenArgs('models', 'list', '--models-dir', path.dirname(dir), '--data-dir', real.dataDir), { cwd: PROJECT_ROOT })).stdout;
    expect((await generate('512x512')).data).toHaveLength(1);
    // The SD 1.5 export's VAE decoder attends over every latent pixel; the demo model's has no attention.
    await expect.poll(async () => (await readMemoryFigures(real.dataDir))[dir]?.decode?.attentionBytes).toBeGreaterThan(0);
    expect(await list()).toMatch(/\nmain\s+sd\/sd15\s+\S+ MiB\s+\S+ MiB \+ /);

    await execFileAsync(process.execPath, imagegenArgs('models', 'import', DEMO_MODEL_DIR, '--name', 'main', '--force', '--skip-load', '--models-dir', path.dirname(dir)), { cwd: PROJECT_ROOT });
    // Before, the SD 1.5 export's figures stood for the model in its place: shown, and planned on (its calibration skipped).
    expect(await list()).toMatch(/\nmain\s+sd\/sd-turbo\s+\S+ KiB\s+not measured\s+ok\n/);
    expect((await generate('512x512')).data).toHaveLength(1);
    await expect.poll(async () => (await readMemoryFigures(real.dataDir))[dir]?.decode?.attentionBytes).toBe(0);
    // Calibrated as it loaded, as a model new to the machine is: its first step, at half its 512 side,
    // is measured whatever it took. Its second, at three quarters, may add no figure: the demo model
    // needs a few KiB more there, within the allocator's noise (ARENA_NOISE) in a worker whose heap
    // still holds what the SD 1.5 export freed (its load measured 0 B), and one run in three added none.
    expect((await readMemoryFigures(real.dataDir))[dir].denoise?.map((sample) => sample.pixels)).toContain(256 * 256);
    // Measured, in whatever unit: the demo model's step at 256x256 took about 1 MiB, and 1004 KiB once.
    expect(await list()).toMatch(/\nmain\s+sd\/sd-turbo\s+\S+ KiB\s+\S+ \S*B \+ \S+ \S*B at 0\.\d MP\s+ok\n/);
  }, REAL_EXPORT_TIMEOUT_MS);
});
