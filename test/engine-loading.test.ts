import { rmSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { OnnxModel } from '../src/runtime/onnx-model.js';
import { inspectModel, MISSING_FOLDER } from '../src/models/layout.js';
import { readMemoryFigures } from '../src/models/memory-figures.js';
import { loadPipeline, type DecodePlanner } from '../src/pipelines/load.js';
import { cudaInstalled } from './helpers/cuda.js';
import { capturedLogs } from './helpers/logs.js';
import type { CudaEnvironment } from '../src/runtime/nvidia-gpus.js';
import { startRealServer, type RealServer } from './helpers/real-server.js';
import { copyOfReference, referenceModel } from './helpers/reference.js';

describe('model folders', () => {
  it('reads the VAE scaling factor and the components from each export convention', async () => {
    const legacy = await inspectModel(referenceModel('sd15-legacy'));
    expect(legacy.denoiser).toMatch(/unet[/\\]model\.onnx$/);
    const sdxl = await inspectModel(referenceModel('sdxl'));
    expect(sdxl.vae.scalingFactor).toBe(0.13025);
    expect(sdxl.textEncoder2).toBeDefined();
    const flux = await inspectModel(referenceModel('flux-dev'));
    expect([flux.family, flux.variant, flux.vae]).toEqual(['flux', 'flux-dev', { scalingFactor: 0.3611, shiftFactor: 0.1159, scaleFactor: 8, midBlockAttention: false }]);
  });

  it('says what is missing from a folder that is not a usable model', async () => {
    const dir = await copyOfReference('sdxl');
    await rm(path.join(dir, 'unet'), { recursive: true });
    await rm(path.join(dir, 'tokenizer_2'), { recursive: true });
    await expect(inspectModel(dir)).rejects.toThrow(/missing unet\/model\.onnx or transformer\/model\.onnx, .*tokenizer_2\//);
    await expect(inspectModel(path.join(dir, 'nowhere'))).rejects.toThrow('the folder does not exist');
  });

  it('refuses a tokenizer without its merges and a scheduler it cannot run, before any request', async () => {
    const dir = await copyOfReference('sd15-legacy');
    await rm(path.join(dir, 'tokenizer', 'merges.txt'));
    await expect(inspectModel(dir)).rejects.toThrow(/tokenizer: merges\.txt is missing/);
    const other = await copyOfReference('sd15-optimum');
    // A class it runs, set up as it does not, on noise levels of its own (a class it does not run at all, or a DPM-Solver
    // variant only diffusers runs, has a stand-in: model-folders.test.ts).
    // (Its Karras, exponential, beta and Lu sigmas it runs: schedulers.test.ts.)
    await writeFile(path.join(other, 'scheduler', 'scheduler_config.json'), JSON.stringify({ _class_name: 'DPMSolverMultistepScheduler', use_flow_sigmas: true }));
    await expect(inspectModel(other)).rejects.toThrow(/scheduler_config\.json: DPMSolverMultistepScheduler: use_flow_sigmas=true is not supported/);
  });

  it('names the component that cannot be loaded', async () => {
    const dir = await copyOfReference('sd15-optimum');
    await writeFile(path.join(dir, 'vae_decoder', 'model.onnx'), 'not an onnx file');
    await expect(loadPipeline(dir, { provider: 'cpu', threads: 1 })).rejects.toThrow(/vae_decoder[/\\]model\.onnx is cut short or is not an ONNX graph/);
  });

  it("names a tokenizer that cannot be read as the folder's problem, and a folder removed while it loads as removed", async () => {
    const dir = await copyOfReference('sd15-legacy');
    // Damaged after the scan that found the folder usable: the tokenizer's reader's bare error was all there was.
    await writeFile(path.join(dir, 'tokenizer', 'vocab.json'), '{"a": ');
    await expect(loadPipeline(dir, { provider: 'cpu', threads: 1 })).rejects.toMatchObject({
      name: 'ModelLayoutError',
      problem: expect.stringMatching(/^cannot load the tokenizer: tokenizer[/\\]vocab\.json is not valid JSON/),
    });
    // `models remove` as the load runs, timed by the decode planner, which the load consults once the VAE decoder is loaded.
    const removed = await copyOfReference('sd15-optimum');
    const removing: DecodePlanner = {
      vaeTiler: () => {
        rmSync(removed, { recursive: true });
        return () => undefined;
      },
      encoded: () => undefined,
    };
    await expect(loadPipeline(removed, { provider: 'cpu', threads: 1 }, removing)).rejects.toMatchObject({ name: 'ModelLayoutError', problem: MISSING_FOLDER });
  });

  it('loads external weight files (weights.pb, model.onnx_data) next to the graph', async () => {
    for (const family of ['sd15-legacy', 'sd15-optimum']) {
      const layout = await inspectModel(referenceModel(family));
      const unet = await OnnxModel.load(layout.denoiser, { provider: 'cpu', threads: 1 });
      expect(unet.hasInput('encoder_hidden_states')).toBe(true);
      await unet.release();
    }
  });
});

/**
 * Starts a server with `script` as the nvidia-smi its PATH finds first (it runs once, as the server
 * starts), whatever nvidia-smi this machine has: a machine with a driver but without the CUDA
 * provider's libraries runs these tests too. CUDA's own variables are as `cuda` gives them (by default
 * unset, whatever this machine's are), for the server to read as it starts.
 */
async function withNvidiaSmi(script: string, start: () => Promise<RealServer>, cuda: CudaEnvironment = {}): Promise<RealServer> {
  const bin = await mkdtemp(path.join(os.tmpdir(), 'nvidia-smi-'));
  const saved = { PATH: process.env.PATH, CUDA_VISIBLE_DEVICES: process.env.CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER: process.env.CUDA_DEVICE_ORDER };
  const restore = (values: Record<string, string | undefined>) => {
    for (const [name, value] of Object.entries(values)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  };
  try {
    await writeFile(path.join(bin, 'nvidia-smi'), script, { mode: 0o755 });
    restore({ PATH: `${bin}${path.delimiter}${saved.PATH}`, CUDA_VISIBLE_DEVICES: cuda.CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER: cuda.CUDA_DEVICE_ORDER });
    return await start();
  } finally {
    restore(saved);
    await rm(bin, { recursive: true, force: true });
  }
}

/** An nvidia-smi that lists GPUs of these MiB, as the driver's answers the server's query ("index, uuid, MiB, MIG mode"). */
const nvidiaSmiListing = (mib: readonly number[], mig = '[N/A]') =>
  `#!/bin/sh\nprintf "${mib.map((m, index) => `${index}, GPU-0000000${index}-aaaa-bbbb-cccc-ddddeeeeffff, ${m}, ${mig}\\n`).join('')}"\n`;

describe.skipIf(cudaInstalled)('execution providers (skipped: the CUDA provider is installed here)', () => {
  it('falls back to the CPU with a message saying why when CUDA cannot load', async () => {
    // This machine has no CUDA provider libraries (npm ci skips them), so onnxruntime-node throws.
    const warnings: string[] = [];
    const layout = await inspectModel(referenceModel('sd15-optimum'));
    const model = await OnnxModel.load(layout.vaeDecoder, { provider: 'cuda', deviceId: 0, threads: 1, warn: (m) => warnings.push(m) });
    expect(model.provider).toBe('cpu');
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/CUDA execution provider unavailable \(.+\); running on CPU/);
    await model.release();
  });

  it("says so in the server's log, as one of its lines naming the worker, when a worker process falls back", async () => {
    const logs = capturedLogs<{ msg: string; worker?: number; level: number; from?: string }>();
    // As nvidia-smi fails where no driver is loaded.
    const noDriver = '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n';
    const server = await withNvidiaSmi(noDriver, () => startRealServer({ env: { EXECUTION_PROVIDER: 'cuda', WORKERS: '1' }, logger: logs.logger }));
    try {
      const fallback = () => logs.lines.find((line) => /CUDA execution provider unavailable \(.+\); running on CPU/.test(line.msg));
      await expect.poll(fallback, { timeout: 60_000 }).toBeDefined();
      // pino's warn level, from worker 0: not a bare line on the worker's stderr.
      expect(fallback()).toMatchObject({ worker: 0, level: 40 });
      // Nor is onnxruntime's own line naming the library, which it writes to stderr in colours: an error line of worker 0.
      expect(logs.lines.find((line) => line.msg.includes('Failed to load library'))).toMatchObject({
        worker: 0,
        level: 50,
        from: 'onnxruntime',
        msg: expect.stringMatching(/\[ONNXRuntimeError\] : 1 : FAIL : Failed to load library \S+libonnxruntime_providers_shared\.so with error: .*cannot open shared object file/),
      });
      // Nor can nvidia-smi say: the loaded models' budget stays RAM's share, and the log says to set it.
      expect(logs.lines.find((line) => line.msg.startsWith('MODEL_MEMORY_BUDGET'))).toMatchObject({
        level: 40,
        msg: expect.stringMatching(/^MODEL_MEMORY_BUDGET is not set and nvidia-smi could not be run \(NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\.\): the loaded models are kept within 60% of RAM, not of the GPU's memory\. Set MODEL_MEMORY_BUDGET/),
      });
    } finally {
      await server.close();
    }
  }, 90_000);

  it("keeps no figures of a worker that runs on the CPU in CUDA's place in DATA_DIR's CUDA figures, which plan the GPU's batches once it starts", async () => {
    // A first start whose CUDA libraries do not load: its calibration and runs are the CPU's. Kept as
    // CUDA's, they stayed once the libraries were installed (a model with figures is not calibrated
    // again), and the GPU's batches were planned from the CPU's activations in host memory: 507s and
    // tiled decodes of sizes the GPU makes, fewer default WORKERS.
    const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-server-'));
    try {
      const server = await withNvidiaSmi(nvidiaSmiListing([24564]), () => startRealServer({ root, env: { EXECUTION_PROVIDER: 'cuda', WORKERS: '1' } }));
      try {
        const made = await server.client.images.generate({ prompt: 'a red circle', response_format: 'b64_json' });
        expect(made.data).toHaveLength(1);
      } finally {
        await server.close();
      }
      expect(await readMemoryFigures(server.dataDir, 'cuda')).toEqual({});
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  }, 90_000);

  /**
   * A cuda server under `listing`'s nvidia-smi, with the reference models a and b: its log's lines, and
   * the models its worker still holds once it has run a, then b.
   */
  async function budgetAfterTwoModels(listing: string, env: Record<string, string>, cuda?: CudaEnvironment): Promise<{ messages: string[]; held: Record<string, number> }> {
    const logs = capturedLogs<{ msg: string }>();
    const models = { a: { link: referenceModel('sd-turbo') }, b: { link: referenceModel('sd15-optimum') } };
    const server = await withNvidiaSmi(listing, () => startRealServer({ env: { EXECUTION_PROVIDER: 'cuda', WORKERS: '1', ...env }, models, logger: logs.logger }), cuda);
    try {
      for (const model of ['a', 'b']) await server.client.images.generate({ model, prompt: 'a red circle', response_format: 'b64_json' });
      return { messages: logs.lines.map((line) => line.msg), held: server.server.engine.modelsHeld() };
    } finally {
      await server.close();
    }
  }

  it("keeps the loaded models' weights within 60% of the smallest GPU's memory, as nvidia-smi lists it, not of RAM", async () => {
    // Two GPUs of 3 MiB and 2 MiB, in CUDA's default numbering (fastest first), which nvidia-smi cannot
    // tell: the budget (1.2 MiB) holds one reference model's weights (0.9 MB) and not two. RAM's share would hold them all.
    const { messages, held } = await budgetAfterTwoModels(nvidiaSmiListing([3, 2]), {});
    expect(messages).toContain(
      "MODEL_MEMORY_BUDGET not set: each worker keeps up to 1.2 MiB of model weights loaded, 60% of the smallest GPU's 2.0 MiB (nvidia-smi lists 2 GPUs; CUDA numbers them fastest first, which nvidia-smi cannot tell: set CUDA_DEVICE_ORDER=PCI_BUS_ID, or name the GPUs by UUID in CUDA_VISIBLE_DEVICES, to count only those the workers use)",
    );
    // The one it ran last, the others (the preloaded default model too) let go as each next one loaded.
    expect(held).toEqual({ b: 1 });
  }, 90_000);

  it('counts only the GPU the workers run on where CUDA numbers the GPUs as nvidia-smi does (CUDA_DEVICE_ORDER=PCI_BUS_ID)', async () => {
    // A 2 MiB display card on the first bus, and the 64 MiB GPU CUDA_DEVICES gives the worker: its budget
    // (38.4 MiB) holds every model. Before, the smallest GPU's 1.2 MiB held one.
    const { messages, held } = await budgetAfterTwoModels(nvidiaSmiListing([2, 64]), { CUDA_DEVICES: '1', PRELOAD: 'none' }, { CUDA_DEVICE_ORDER: 'PCI_BUS_ID' });
    expect(messages).toContain("MODEL_MEMORY_BUDGET not set: each worker keeps up to 38.4 MiB of model weights loaded, 60% of GPU 1's 64.0 MiB");
    expect(held).toEqual({ a: 1, b: 1 });
  }, 90_000);

  it("keeps RAM's share, saying why and what to set, where the GPU is split into MIG instances, the workers get one, or CUDA_DEVICES names no GPU", async () => {
    const budgetLine = async (script: string, env: Record<string, string>, cuda?: CudaEnvironment) => {
      const logs = capturedLogs<{ msg: string; level: number }>();
      const server = await withNvidiaSmi(script, () => startRealServer({ env: { EXECUTION_PROVIDER: 'cuda', WORKERS: '1', PRELOAD: 'none', ...env }, logger: logs.logger }), cuda);
      await server.close();
      return logs.lines.find((line) => line.msg.startsWith('MODEL_MEMORY_BUDGET'));
    };
    // memory.total is the whole GPU's, not the instance's the worker gets.
    expect(await budgetLine(nvidiaSmiListing([81559], 'Enabled'), {})).toMatchObject({
      level: 40,
      msg: expect.stringMatching(/^MODEL_MEMORY_BUDGET is not set and GPU 0 is split into MIG instances, whose memory nvidia-smi does not give \(only the whole GPU's\): the loaded models are kept within 60% of RAM, not of the GPU's memory\. Set MODEL_MEMORY_BUDGET/),
    });
    // A MIG instance CUDA_VISIBLE_DEVICES names (CUDA runs on it): before, said to be no GPU at all.
    expect(await budgetLine(nvidiaSmiListing([81559], 'Enabled'), {}, { CUDA_VISIBLE_DEVICES: 'MIG-5a1b2c3d-0000-1111-2222-333344445555' })).toMatchObject({
      level: 40,
      msg: expect.stringMatching(/^MODEL_MEMORY_BUDGET is not set and CUDA_VISIBLE_DEVICES gives the workers MIG instance MIG-5a1b2c3d-0000-1111-2222-333344445555, whose memory nvidia-smi does not give \(only its GPU's, whole\): the loaded models are kept within 60% of RAM/),
    });
    expect(await budgetLine(nvidiaSmiListing([2]), { CUDA_DEVICES: '1' }, { CUDA_VISIBLE_DEVICES: '0' })).toMatchObject({
      level: 40,
      msg: expect.stringMatching(/^MODEL_MEMORY_BUDGET is not set and CUDA_DEVICES \(1\) names none of the 1 GPU nvidia-smi lists within CUDA_VISIBLE_DEVICES=0: the loaded models are kept within 60% of RAM/),
    });
  }, 90_000);

  it('splits the share of a device among the workers CUDA_DEVICES puts on it, a device it names twice included', async () => {
    const logs = capturedLogs<{ msg: string }>();
    const oneGpu = nvidiaSmiListing([2]);
    // Workers 0 and 1 on device 0, worker 2 on device 1: two share device 0 (not 3 workers over 3 names, one each).
    const env = { EXECUTION_PROVIDER: 'cuda', CUDA_DEVICES: '0,0,1', WORKERS: '3', PRELOAD: 'none' };
    const server = await withNvidiaSmi(oneGpu, () => startRealServer({ env, logger: logs.logger }));
    await server.close();
    expect(logs.lines.map((line) => line.msg)).toContain("MODEL_MEMORY_BUDGET not set: each worker keeps up to 614.4 KiB of model weights loaded, 60% of GPU 0's 2.0 MiB, split among the 2 workers that share a device");
  }, 90_000);
});
