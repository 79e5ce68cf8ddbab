import { spawnSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import OpenAI, { toFile } from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EMBEDDED_MODELS_DIR } from '../src/config.js';
import { readMemoryFigures, writeMemoryFigures, type ModelMemory } from '../src/models/memory-figures.js';
import { cgroupUnavailable, makeMemoryCgroup, type MemoryCgroup } from './helpers/cgroup.js';
import { PROJECT_ROOT } from './helpers/cli.js';
import { apiError } from './helpers/failures.js';
import { makeHeavy, makeHeavyVae } from './helpers/heavy-model.js';
import { haveRealExports, realExport } from './helpers/real-exports.js';
import { installModels } from './helpers/real-server.js';
import { killServer, spawnServer, type ServerProcess, type SpawnOptions } from './helpers/server-process.js';
import type { ErrorBody } from '../src/api/wire.js';

/**
 * Models and batches that run out of memory though the plan let them run (another process took the memory, or a
 * limit the plan cannot see, such as the GPU's), made to happen for real with the SD 1.5 export: a
 * 768x512 image with guidance takes about 4.4 GB above the loaded model, a 512x512 one without about
 * 1.2 GB. Either way the client gets a 507 that says what to change, the server learns that the size
 * needs more than it had (the same request is then refused up front), and a smaller request runs.
 * Those figures are of the export's graphs rewritten only where exact (GRAPH_REWRITES=exact): with its
 * attention fused (the default), the 768x512 image takes a fraction of that and no limit a test can set
 * makes it fail while the 512x512 one fits.
 */

/**
 * WORKER_THREADS of the servers under a data-size limit (ulimit -d), which counts each thread's stack:
 * each session of a worker has an intra-op thread per core by default. The demo model's sessions took
 * 0.23 GiB of data with 2 threads and 1.7 GiB with 64, so the limits below, set on 2 cores, failed where
 * there are many (with 48 threads the 1 GB test ran into its time limit).
 */
const DATA_LIMITED_THREADS = '2';

/** What a bare Node process holds of the data-size limit, in KiB (dataLimitKb). */
let bareNodeDataKb: number | undefined;

/**
 * A data-size limit (ulimit -d) of `aboveKb` KiB beyond what a Node process that has done nothing
 * holds: the limits below are what the server or a worker may take beyond that. A bare Node 24 or later
 * holds 560 MiB (V8 maps its whole 512 MiB code range writable as it starts), where Node 20 and 22 held
 * 48 MiB, so that limits written whole, measured on Node 20, left the models 512 MiB less on the newer
 * ones.
 */
function dataLimitKb(aboveKb: number): number {
  // Measured at the first limit, once: a bare Node holds the same at each.
  bareNodeDataKb ??= Number(/^VmData:\s+(\d+) kB$/m.exec(spawnSync(process.execPath, ['-p', "require('node:fs').readFileSync('/proc/self/status', 'utf8')"], { encoding: 'utf8' }).stdout)![1]);
  return bareNodeDataKb + aboveKb;
}

const cgroupSkip = await cgroupUnavailable();
if (cgroupSkip) console.warn(`skipping the OOM-killer test: ${cgroupSkip}`);

/** The SD 1.5 export installed as 'sd15' in a root of its own, and `imagegen serve` started on it. */
async function startSd15(options: SpawnOptions, { env = {}, figures }: { env?: Record<string, string>; figures?: (modelDir: string) => Record<string, ModelMemory> } = {}) {
  const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-oom-'));
  const modelsDir = path.join(root, 'models');
  const dataDir = path.join(root, 'data');
  await installModels(modelsDir, { sd15: { link: realExport('sd15') } });
  if (figures) await writeMemoryFigures(dataDir, figures(path.join(modelsDir, 'sd15')), 'cpu', 'exact');
  const server = await spawnServer({ PORT: '0', DATA_DIR: dataDir, MODELS_DIR: modelsDir, DEFAULT_MODEL: 'sd15', PRELOAD: 'sd15', MODELS_RESCAN_SECONDS: '0', GRAPH_REWRITES: 'exact', ...env }, options);
  const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 });
  const generate = (size: string, guidance: number) => client.images.generate({ model: 'sd15', prompt: 'a cat', size, response_format: 'b64_json', steps: 1, guidance_scale: guidance } as never);
  return {
    server,
    dataDir,
    generate,
    async close() {
      await killServer(server);
      await rm(root, { recursive: true, force: true });
    },
  };
}

/**
 * The same request again is refused by the plan before it runs; a smaller one runs. The lesson lasts
 * the server's lifetime but is not kept in DATA_DIR (a restart, with more memory free, tries again).
 */
async function expectLearnt({ generate, dataDir }: { generate: (size: string, guidance: number) => Promise<OpenAI.ImagesResponse>; dataDir: string }) {
  const again = await apiError(generate('768x512', 7.5));
  expect(again.status).toBe(507);
  expect(again.error).toMatchObject({ code: 'insufficient_memory', message: expect.stringMatching(/^Model 'sd15' needs about .* of 768x512 and batches may plan on/) });
  expect((await generate('512x512', 0)).data).toHaveLength(1);
  const kept = Object.values(await readMemoryFigures(dataDir, 'cpu', 'exact'));
  expect(kept.length).toBe(1);
  expect(kept[0]).not.toHaveProperty('exceeded');
}

describe.skipIf(!haveRealExports)('a run that onnxruntime cannot allocate (needs ../shared/data/real-exports)', () => {
  // A data-size limit on the server and its workers (ulimit -d, 1.95 GB above a bare Node's: see
  // dataLimitKb) makes onnxruntime's allocations fail, while the machine's free memory still tells the
  // plan that the 768x512 image fits. MEMORY_LIMIT holds what the plan has to give steady while other
  // tests come and go: the failed run teaches that the image needs more than it was planned with (90%
  // of what was free, within the limit), and the same request is refused only while the plan has no
  // more than that. 6g (5.4 GiB to plan with, above the 3.5 GiB the plan expects the image to take) is
  // steady wherever 6 GiB are free; 10g needed 10 GiB, and with less the plan could grow as other tests
  // freed memory, past the lesson, and run the image again (a second 'ran out of memory' where 'needs
  // about' was expected). WORKER_THREADS as on 2 cores (see DATA_LIMITED_THREADS).
  let sd15: Awaited<ReturnType<typeof startSd15>>;
  beforeAll(async () => {
    sd15 = await startSd15({ limitsKb: { data: dataLimitKb(1_950_000) } }, { env: { MEMORY_LIMIT: '6g', WORKER_THREADS: DATA_LIMITED_THREADS } });
  });
  afterAll(() => sd15?.close());

  it('answers 507 insufficient_memory saying what to change, and the same worker serves on', async () => {
    const error = await apiError(sd15.generate('768x512', 7.5));
    expect(error.status).toBe(507);
    expect(error.error).toMatchObject({
      code: 'insufficient_memory',
      message: expect.stringMatching(/^Model 'sd15' ran out of memory making 1 image\(s\) of 768x512 \(onnxruntime: .*(bad_alloc|Failed to allocate).*\)\. Ask for a smaller size or fewer images.*MODEL_MEMORY_BUDGET/),
    });
    // The model's sessions were released (their arenas kept what the failed run got): without that the
    // 512x512 image that follows fails in the VAE decoder.
    await expectLearnt(sd15);
    // Still the first worker: the failure cost the request, not the process.
    expect(sd15.server.log.some((line) => line.includes('starting a replacement'))).toBe(false);
  });
});

describe.skipIf(!haveRealExports || cgroupSkip)('a worker the OOM killer ends (needs ../shared and root with a memory cgroup)', () => {
  // The server runs in a memory cgroup of 1.6 GiB, which its plan sees (the worker's peak for the
  // 768x512 image with guidance is 1.7 GiB, for the 512x512 one without 0.8 GiB; the server takes
  // about 0.25 GiB beside it); figures that say the model needs
  // almost nothing make it run the 768x512 image, and the kernel's OOM killer ends the worker (the
  // one it prefers: see worker.ts's oom_score_adj).
  let group: MemoryCgroup;
  let sd15: Awaited<ReturnType<typeof startSd15>>;
  const MiB = 2 ** 20;
  beforeAll(async () => {
    group = await makeMemoryCgroup(1.6 * 2 ** 30);
    sd15 = await startSd15(
      { cgroup: group.dir },
      { figures: (dir) => ({ [dir]: { weightsBytes: MiB, peakBytes: MiB, peakPixels: 768 * 512, denoise: [{ pixels: 768 * 512, bytes: MiB }] } }) },
    );
  });
  afterAll(async () => {
    await sd15?.close();
    await group?.remove();
  });

  it('answers 507 insufficient_memory naming the model, the size and what it was planned with, and plans better from then on', async () => {
    const error = await apiError(sd15.generate('768x512', 7.5));
    expect(error.status).toBe(507);
    expect(error.error).toMatchObject({
      code: 'insufficient_memory',
      message: expect.stringMatching(/^The worker process generating this image was killed by the system for running out of memory: model 'sd15' at 768x512 needed more than the .* it was planned with\./),
    });
    // Planned within the group's limit, which the plan reads (cgroup v1 or v2), not the machine's free memory.
    const [, amount, unit] = /than the ([\d.]+) (MiB|GiB) it was planned with/.exec(error.message)!;
    expect(Number(amount) * (unit === 'GiB' ? 1024 : 1)).toBeLessThan(1.6 * 1024);
    await expect.poll(() => sd15.server.log.some((line) => line.includes('the OOM killer ended a worker'))).toBe(true);
    await expectLearnt(sd15);
  });
});

/**
 * `imagegen serve` on copies of the embedded model (`models`: their ids), each changed by its function
 * (given its folder) before the server starts under a data-size limit of `dataKb` on it and its workers
 * (ulimit -d: see dataLimitKb), which the plan cannot see: the machine's free memory tells it the
 * models fit. One worker: the tests follow what it holds and releases to make room, and of two, a model
 * new to the pool loads on the one holding fewest models (pool.ts's workerFor), which had nothing to
 * release.
 */
async function serveDemoCopies(models: Record<string, (dir: string) => Promise<void>>, env: Record<string, string>, dataKb: number) {
  const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-load-oom-'));
  const modelsDir = path.join(root, 'models');
  const demo = path.join(EMBEDDED_MODELS_DIR, 'demo-shapes');
  await installModels(modelsDir, Object.fromEntries(Object.keys(models).map((id) => [id, { copy: demo }])));
  for (const [id, make] of Object.entries(models)) await make(path.join(modelsDir, id));
  const server = await spawnServer({ PORT: '0', DATA_DIR: path.join(root, 'data'), MODELS_DIR: modelsDir, MODELS_RESCAN_SECONDS: '0', WORKERS: '1', ...env }, { limitsKb: { data: dataKb } });
  return {
    server,
    client: new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 }),
    async close() {
      await killServer(server);
      await rm(root, { recursive: true, force: true });
    },
  };
}


/** An edit of a plain red 256x256 picture by `model` (its VAE encoder loaded on demand), with `fields` over the rest. */
async function editRed(client: OpenAI, model: string, fields: object = {}) {
  const picture = await sharp({ create: { width: 256, height: 256, channels: 3, background: '#c03020' } }).png().toBuffer();
  return client.images.edit({ model, image: await toFile(picture, 'in.png', { type: 'image/png' }), prompt: 'a cat', size: '256x256', response_format: 'b64_json', ...fields } as OpenAI.ImageEditParamsNonStreaming);
}
describe('a model whose sessions onnxruntime cannot allocate as they load', () => {
  // Copies of the embedded model whose VAE decoder ('heavy') or VAE encoder ('heavy-encoder') weighs
  // 2 GiB, under a data-size limit of 0.95 GB above a bare Node's: onnxruntime's allocation fails as
  // the session is created.
  let started: Awaited<ReturnType<typeof serveDemoCopies>>;
  beforeAll(async () => {
    started = await serveDemoCopies(
      { heavy: (dir) => makeHeavy(dir, 'vae_decoder'), 'heavy-encoder': (dir) => makeHeavy(dir, 'vae_encoder') },
      { PRELOAD: 'demo-shapes,heavy', WORKER_THREADS: DATA_LIMITED_THREADS },
      dataLimitKb(950_000),
    );
  });
  afterAll(() => started?.close());
  const generate = (model: string) => started.client.images.generate({ model, prompt: 'a cat', size: '256x256', response_format: 'b64_json' });

  it('answers 507 insufficient_memory naming the component and what to change, not a broken folder, and the worker serves on', async () => {
    const error = await apiError(generate('heavy'));
    expect(error.status).toBe(507);
    // Preloaded after demo-shapes, which the worker released to load it once more: it failed holding no
    // other model, so a lower MODEL_MEMORY_BUDGET is no remedy.
    expect(error.error).toMatchObject({
      code: 'insufficient_memory',
      message: expect.stringMatching(
        /^Model 'heavy' ran out of memory loading vae_decoder\/model\.onnx \(onnxruntime: .*bad_alloc.*\): its weights need more memory than this worker could get, even holding no other model\. Free memory for it: fewer WORKERS \(each holds its own models\), or on CUDA/,
      ),
    });
    expect(releases(started.server)).toEqual(["Model 'heavy' ran out of memory loading vae_decoder/model.onnx; released the idle model(s) 'demo-shapes' to make room for it, and loading it once more."]);
    // /ready says why the preloaded model is missing in the same words.
    const ready = await fetch(`${started.server.origin}/ready`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as ErrorBody).error.message).toMatch(/model 'heavy' failed to load: Model 'heavy' ran out of memory loading vae_decoder\/model\.onnx/);
    expect((await generate('demo-shapes')).data).toHaveLength(1);
    // The worker remembers that releasing demo-shapes cannot help: asked again, it keeps it.
    expect((await apiError(generate('heavy'))).status).toBe(507);
    expect(releases(started.server)).toHaveLength(1);
    expect((await generate('demo-shapes')).data).toHaveLength(1);
    expect(started.server.log.some((line) => line.includes('starting a replacement'))).toBe(false);
  });

  it('answers 507 for a component loaded on demand (the VAE encoder of an edit), and the model still generates', async () => {
    await generate('demo-shapes');
    const error = await apiError(editRed(started.client, 'heavy-encoder'));
    expect(error.status).toBe(507);
    expect(error.error).toMatchObject({ code: 'insufficient_memory', message: expect.stringMatching(/^Model 'heavy-encoder' ran out of memory loading vae_encoder\/model\.onnx \(onnxruntime: .*bad_alloc.*, even holding no other model\./) });
    // Tried once more without demo-shapes, which is not in use while heavy-encoder's edit runs.
    expect(releases(started.server)).toContain("Model 'heavy-encoder' ran out of memory loading vae_encoder/model.onnx; released the idle model(s) 'demo-shapes' to make room for it, and loading it once more.");
    expect((await generate('heavy-encoder')).data).toHaveLength(1);
  });
});

/** What the server logged of models a worker released to make room for another (WorkerRuntime.withRoom). */
function releases(server: ServerProcess): string[] {
  return server.log.filter((line) => line.includes('to make room')).map((line) => (JSON.parse(line) as { msg: string }).msg);
}

describe('models that load one at a time but not side by side', () => {
  // Copies of the embedded model whose VAE decoder ('first', 'second') or encoder ('editor') carries a
  // 512 MiB weight beside its own graph (see makeHeavyVae), under a data-size limit (ulimit -d, above a
  // bare Node's: see dataLimitKb) that the weight budget cannot see. onnxruntime takes twice the weight
  // as it prepacks it. Measured on Node 24 with WORKER_THREADS=2 and demo-shapes held (on Node 20, as
  // whole limits, the same figures plus its bare process's 50 MiB): the test failed at limits of 1,150
  // MiB and below (one heavy model does not load alone) and at 1,750 and above ('second' loads beside
  // 'first', nothing released), and passed from 1,250 to 1,700. 1,450 leaves about 250 MiB either side:
  // with 256 MiB weights the window was 770 to 950 MiB, too narrow for a worker whose data segment varies
  // by tens of MiB between runs (after a failed allocation its heap keeps some of what it freed).
  const MiB = 2 ** 20;
  // At 256x256 the decoder's latents hold 4 x 32 x 32 values, the encoder's picture 3 x 256 x 256.
  const heavyDecoder = (dir: string) => makeHeavyVae(dir, 'vae_decoder', 512 * MiB, 4 * 32 * 32);
  let started: Awaited<ReturnType<typeof serveDemoCopies>>;
  beforeAll(async () => {
    started = await serveDemoCopies(
      {
        first: heavyDecoder,
        second: heavyDecoder,
        editor: (dir) => makeHeavyVae(dir, 'vae_encoder', 512 * MiB, 3 * 256 * 256),
        // Loads alone (as 'first' does), but its 2 GiB VAE encoder never does.
        'no-edits': async (dir) => {
          await heavyDecoder(dir);
          await makeHeavy(dir, 'vae_encoder');
        },
      },
      { PRELOAD: 'demo-shapes,first', WORKER_THREADS: DATA_LIMITED_THREADS },
      dataLimitKb(1450 * 1024),
    );
  });
  afterAll(() => started?.close());
  const generate = (model: string) =>
    started.client.images.generate({ model, prompt: 'a red circle', size: '256x256', response_format: 'b64_json', seed: 1 } as OpenAI.ImageGenerateParamsNonStreaming);
  const edit = (model: string) => editRed(started.client, model, { seed: 2 });

  it('releases the idle models to load one more, which then makes the pictures it should', async () => {
    const first = await generate('first');
    const second = await generate('second');
    expect(releases(started.server)).toEqual(["Model 'second' ran out of memory loading vae_decoder/model.onnx; released the idle model(s) 'demo-shapes', 'first' to make room for it, and loading it once more."]);
    // The VAE encoder, loaded as the first edit runs: the edit runs again once 'second' is released.
    const edited = await edit('editor');
    expect(releases(started.server)[1]).toBe("Model 'editor' ran out of memory loading vae_encoder/model.onnx; released the idle model(s) 'second' to make room for it, and loading it once more.");
    // The heavy components compute what the demo model's do.
    expect(second.data![0].b64_json).toBe(first.data![0].b64_json);
    expect((await generate('demo-shapes')).data![0].b64_json).toBe(first.data![0].b64_json);
    expect((await edit('demo-shapes')).data![0].b64_json).toBe(edited.data![0].b64_json);
    expect(started.server.log.some((line) => line.includes('starting a replacement'))).toBe(false);
  });

  it('remembers a component that fails alone apart from its model, which still gets room to load', async () => {
    await generate('no-edits');
    const error = await apiError(edit('no-edits'));
    expect(error.error).toMatchObject({ code: 'insufficient_memory', message: expect.stringMatching(/^Model 'no-edits' ran out of memory loading vae_encoder\/model\.onnx .*, even holding no other model\./) });
    await generate('first');
    expect(releases(started.server).at(-1)).toBe("Model 'first' ran out of memory loading vae_decoder/model.onnx; released the idle model(s) 'no-edits' to make room for it, and loading it once more.");
    // Its encoder failed alone, not the model: 'first' is released for it as for any other.
    expect((await generate('no-edits')).data).toHaveLength(1);
    expect(releases(started.server).at(-1)).toBe("Model 'no-edits' ran out of memory loading vae_decoder/model.onnx; released the idle model(s) 'first' to make room for it, and loading it once more.");
  });
});

describe('a model that failed to load alone while memory was taken elsewhere, then loaded', () => {
  // WorkerRuntime in a process of its own under a data-size limit of 1,450 MiB above a bare Node's,
  // with copies of the embedded model whose VAE decoder carries a 512 MiB weight (as above: one loads,
  // two do not). Another session outside the runtime's models ('elsewhere', another process or a GPU's
  // other user in life) holds what makes the first load fail though the runtime holds no other model;
  // then it lets go. The built modules, as a worker runs them: under tsx, Node 24 and later start a
  // thread for its loader at the first TypeScript module, whose V8 holds 512 MiB more data (see
  // dataLimitKb), and 'elsewhere' no longer loaded.
  it('still has the other models released for it once it has loaded: its failure alone is no longer what it does', async () => {
    const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-alone-'));
    try {
      const demo = path.join(EMBEDDED_MODELS_DIR, 'demo-shapes');
      await installModels(root, { first: { copy: demo }, second: { copy: demo }, elsewhere: { copy: demo } });
      for (const id of ['first', 'second', 'elsewhere']) await makeHeavyVae(path.join(root, id), 'vae_decoder', 512 * 2 ** 20, 4 * 32 * 32);
      const url = (file: string) => JSON.stringify(pathToFileURL(path.join(PROJECT_ROOT, 'dist', file)).href);
      const script = `import { WorkerRuntime } from ${url('pipelines/run.js')};
        import { OnnxModel } from ${url('runtime/onnx-model.js')};
        const dir = (id) => ${JSON.stringify(root)} + '/' + id;
        const warnings = [];
        const runtime = new WorkerRuntime({ runtime: { provider: 'cpu', threads: 2, warn: (m) => warnings.push(m) }, modelMemoryBudget: Number.MAX_SAFE_INTEGER });
        const load = (id) => runtime.getPipeline(dir(id)).then(() => 'loaded', (err) => err.message);
        const elsewhere = await OnnxModel.load(dir('elsewhere') + '/vae_decoder/model.onnx', { provider: 'cpu', threads: 2 }, { memoryArena: false });
        const outcomes = [await load('first')];
        await elsewhere.release();
        outcomes.push(await load('first'), await load('second'), await load('first'));
        console.log(JSON.stringify({ outcomes, warnings }));`;
      const run = spawnSync('bash', ['-c', `ulimit -d ${dataLimitKb(1450 * 1024)} && exec "$@"`, 'bash', process.execPath, '--input-type=module', '-e', script], { encoding: 'utf8', timeout: 120_000 });
      expect(run.status, run.stderr).toBe(0);
      const { outcomes, warnings } = JSON.parse(run.stdout.trim().split('\n').at(-1)!) as { outcomes: string[]; warnings: string[] };
      expect(outcomes[0]).toMatch(/^Model 'first' ran out of memory loading vae_decoder\/model\.onnx .*, even holding no other model\./);
      expect(outcomes.slice(1)).toEqual(['loaded', 'loaded', 'loaded']);
      expect(warnings.filter((w) => w.includes('to make room'))).toEqual([
        "Model 'second' ran out of memory loading vae_decoder/model.onnx; released the idle model(s) 'first' to make room for it, and loading it once more.",
        "Model 'first' ran out of memory loading vae_decoder/model.onnx; released the idle model(s) 'second' to make room for it, and loading it once more.",
      ]);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
