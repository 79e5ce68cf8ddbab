import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { OnnxModel } from '../src/runtime/onnx-model.js';
import { inspectModel } from '../src/models/layout.js';
import { loadPipeline } from '../src/pipelines/load.js';
import { cudaInstalled } from './helpers/cuda.js';
import { capturedLogs } from './helpers/logs.js';
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
    // A class it runs, set up as it does not (a class it does not run at all has a stand-in: model-folders.test.ts).
    await writeFile(path.join(other, 'scheduler', 'scheduler_config.json'), JSON.stringify({ _class_name: 'DPMSolverMultistepScheduler', algorithm_type: 'sde-dpmsolver++' }));
    await expect(inspectModel(other)).rejects.toThrow(/scheduler_config\.json: DPMSolverMultistepScheduler: only algorithm_type dpmsolver\+\+/);
  });

  it('names the component that cannot be loaded', async () => {
    const dir = await copyOfReference('sd15-optimum');
    await writeFile(path.join(dir, 'vae_decoder', 'model.onnx'), 'not an onnx file');
    await expect(loadPipeline(dir, { provider: 'cpu', threads: 1 })).rejects.toThrow(/vae_decoder[/\\]model\.onnx is cut short or is not an ONNX graph/);
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
 * provider's libraries runs these tests too.
 */
async function withNvidiaSmi(script: string, start: () => Promise<RealServer>): Promise<RealServer> {
  const bin = await mkdtemp(path.join(os.tmpdir(), 'nvidia-smi-'));
  const PATH = process.env.PATH;
  try {
    await writeFile(path.join(bin, 'nvidia-smi'), script, { mode: 0o755 });
    process.env.PATH = `${bin}${path.delimiter}${PATH}`;
    return await start();
  } finally {
    process.env.PATH = PATH;
    await rm(bin, { recursive: true, force: true });
  }
}

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
    const logs = capturedLogs<{ msg: string; worker?: number; level: number }>();
    // As nvidia-smi fails where no driver is loaded.
    const noDriver = '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n';
    const server = await withNvidiaSmi(noDriver, () => startRealServer({ env: { EXECUTION_PROVIDER: 'cuda', WORKERS: '1' }, logger: logs.logger }));
    try {
      const fallback = () => logs.lines.find((line) => /CUDA execution provider unavailable \(.+\); running on CPU/.test(line.msg));
      await expect.poll(fallback, { timeout: 60_000 }).toBeDefined();
      // pino's warn level, from worker 0: not a bare line on the worker's stderr.
      expect(fallback()).toMatchObject({ worker: 0, level: 40 });
      // Nor can nvidia-smi say: the loaded models' budget stays RAM's share, and the log says to set it.
      expect(logs.lines.find((line) => line.msg.startsWith('MODEL_MEMORY_BUDGET'))).toMatchObject({
        level: 40,
        msg: expect.stringMatching(/^MODEL_MEMORY_BUDGET is not set and nvidia-smi could not be run \(NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\.\): the loaded models are kept within 60% of RAM, not of the GPU's memory\. Set MODEL_MEMORY_BUDGET/),
      });
    } finally {
      await server.close();
    }
  }, 90_000);

  it("keeps the loaded models' weights within 60% of the smallest GPU's memory, as nvidia-smi lists it, not of RAM", async () => {
    // nvidia-smi as the driver's answers it, for two GPUs of 2 MiB and 3 MiB: the budget (1.2 MiB) holds
    // one reference model's weights (0.9 MB) and not two. RAM's share would hold them all.
    const logs = capturedLogs<{ msg: string }>();
    const models = { a: { link: referenceModel('sd-turbo') }, b: { link: referenceModel('sd15-optimum') } };
    const twoGpus = '#!/bin/sh\nprintf "0, 3\\n1, 2\\n"\n';
    const server = await withNvidiaSmi(twoGpus, () => startRealServer({ env: { EXECUTION_PROVIDER: 'cuda', WORKERS: '1' }, models, logger: logs.logger }));
    try {
      expect(logs.lines.map((line) => line.msg)).toContain("MODEL_MEMORY_BUDGET not set: each worker keeps up to 1.2 MiB of model weights loaded, 60% of the smallest GPU's 2.0 MiB (nvidia-smi lists 2 GPUs)");
      for (const model of ['a', 'b']) await server.client.images.generate({ model, prompt: 'a red circle', response_format: 'b64_json' });
      // The one it ran last, the others (the preloaded default model too) let go as each next one loaded.
      expect(server.server.engine.modelsHeld()).toEqual({ b: 1 });
    } finally {
      await server.close();
    }
  }, 90_000);

  it('splits the share of a device among the workers CUDA_DEVICES puts on it, a device it names twice included', async () => {
    const logs = capturedLogs<{ msg: string }>();
    const oneGpu = '#!/bin/sh\necho "0, 2"\n';
    // Workers 0 and 1 on device 0, worker 2 on device 1: two share device 0 (not 3 workers over 3 names, one each).
    const env = { EXECUTION_PROVIDER: 'cuda', CUDA_DEVICES: '0,0,1', WORKERS: '3', PRELOAD: 'none' };
    const server = await withNvidiaSmi(oneGpu, () => startRealServer({ env, logger: logs.logger }));
    await server.close();
    expect(logs.lines.map((line) => line.msg)).toContain("MODEL_MEMORY_BUDGET not set: each worker keeps up to 614.4 KiB of model weights loaded, 60% of the smallest GPU's 2.0 MiB (nvidia-smi lists 1 GPU), split among the 2 workers that share a device");
  }, 90_000);
});
