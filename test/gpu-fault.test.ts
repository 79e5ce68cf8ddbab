import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import OpenAI from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PROJECT_ROOT, WORKER_SCRIPT } from './helpers/cli.js';
import { apiError, failureOf } from './helpers/failures.js';
import { capturedLogs } from './helpers/logs.js';
import { demoBatch } from './helpers/demo-model.js';
import { withDemoPool } from './helpers/demo-pool.js';
import { untilReady } from './helpers/ops-server.js';
import { startRealServer, type RealServer } from './helpers/real-server.js';
import { referenceModel } from './helpers/reference.js';

/**
 * A CUDA error after which a process cannot use the GPU again (an illegal memory access, a launch
 * failure): no machine here has CUDA, so the built worker runs with onnxruntime made to fail as the
 * CUDA provider fails then, in onnxruntime's words (cuda_call.cc): the first session run to find
 * `fault`, or the first session creation (weights copied to the GPU) to find `loadFault` (each removed
 * as it is found) and, as CUDA does, every later run and creation of that process. A process that finds
 * `hang` (which it removes) as it exits after the fault does not exit, as one whose teardown hangs in a
 * driver that lost the GPU. Everything else is the real server, worker and model.
 */
interface FaultingWorker {
  script: string;
  fault: string;
  loadFault: string;
  hang: string;
}

async function faultingWorker(dir: string): Promise<FaultingWorker> {
  const files = { fault: path.join(dir, 'fault'), loadFault: path.join(dir, 'load-fault'), hang: path.join(dir, 'hang') };
  const script = path.join(dir, 'worker.mjs');
  const ortModule = pathToFileURL(path.join(PROJECT_ROOT, 'dist', 'runtime', 'onnxruntime.js')).href;
  await writeFile(
    script,
    `import { existsSync, rmSync } from 'node:fs';
const { ort } = await import(${JSON.stringify(ortModule)});
const Session = ort.InferenceSession;
let lost = false;
const faulting = (trigger, call, where) => function (...args) {
  if (existsSync(trigger)) {
    rmSync(trigger);
    lost = true;
  }
  if (!lost) return call.apply(this, args);
  return Promise.reject(new Error(where + " CUDA failure 700: an illegal memory access was encountered ; GPU=0 ; hostname=gpu-host ; file=/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_execution_provider.cc ; line=448 ; expr=cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)); "));
};
Session.prototype.run = faulting(${JSON.stringify(files.fault)}, Session.prototype.run, "Non-zero status code returned while running Conv node. Name:'/conv_in/Conv' Status Message:");
Session.create = faulting(${JSON.stringify(files.loadFault)}, Session.create, "Exception during initialization:");
const exit = process.exit;
process.exit = (code) => {
  if (code !== 1 || !existsSync(${JSON.stringify(files.hang)})) return exit(code);
  rmSync(${JSON.stringify(files.hang)});
};
await import(${JSON.stringify(pathToFileURL(WORKER_SCRIPT).href)});
`,
  );
  return { script, ...files };
}

const generate = (client: OpenAI) => client.images.generate({ prompt: 'a red circle', size: '256x256', response_format: 'b64_json' });

/** The size of the answer's first picture, decoded. */
async function sizeOf(res: OpenAI.ImagesResponse): Promise<(number | undefined)[]> {
  const meta = await sharp(Buffer.from(res.data![0].b64_json!, 'base64')).metadata();
  return [meta.width, meta.height];
}

describe('a GPU fault that leaves the worker unable to use CUDA', () => {
  let dir: string;
  let worker: FaultingWorker;
  let server: RealServer;
  const logs = capturedLogs<{ msg: string; workerPid?: number }>();

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'gpu-fault-'));
    worker = await faultingWorker(dir);
    // A second model, not preloaded: its first request loads it.
    server = await startRealServer({ workerScript: worker.script, logger: logs.logger, models: { turbo: { copy: referenceModel('sd-turbo'), preset: { sizes: ['256x256'], default_size: '256x256' } } } });
    await untilReady(server.server.url, 60_000);
  });

  afterAll(async () => {
    await server?.close();
    await rm(dir, { recursive: true, force: true });
  });

  const ready = () => logs.lines.filter((line) => line.msg === 'worker ready');

  it('fails its batch with a 500 saying what happened and what to do, and the worker is replaced', async () => {
    await writeFile(worker.fault, '');
    const { status, code, message } = await apiError(generate(server.client), OpenAI.InternalServerError);
    expect(existsSync(worker.fault)).toBe(false);
    expect([status, code]).toEqual([500, 'gpu_fault']);
    // The component within its model's folder, CUDA's own words without onnxruntime's host and source lines.
    expect(message).toMatch(/^500 The GPU failed while model '[^']+' made this image: [\w-]+\/model\.onnx: CUDA failure 700: an illegal memory access was encountered\. CUDA cannot be used again by the process that met this error, so the worker process has been replaced; retrying may succeed\. .*nvidia-smi/);
    expect(message).not.toMatch(/hostname|\/onnxruntime_src|\/tmp\//);
    // A new process, which says why the old one went, without 'while idle'.
    await expect.poll(() => ready().length, { timeout: 60_000 }).toBe(2);
    const [first, second] = ready();
    expect(second.workerPid).not.toBe(first.workerPid);
    expect(logs.lines.map((line) => line.msg)).toContain(
      'worker process ended itself after a GPU fault (CUDA failure 700: an illegal memory access was encountered), after which CUDA cannot be used by the process that met it; starting a replacement',
    );
  });

  it("is behind a client whose SDK retries the 500 on its own, as the official ones do: the replacement draws the picture", async () => {
    await writeFile(worker.fault, '');
    const res = await generate(new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 2 }));
    expect(existsSync(worker.fault)).toBe(false);
    expect(await sizeOf(res)).toEqual([256, 256]);
    await expect.poll(() => ready().length, { timeout: 60_000 }).toBe(3);
  });

  it('is replaced even when it does not exit after saying it ends: killed, as a stop that hangs is', async () => {
    const before = ready().length;
    await writeFile(worker.hang, '');
    await writeFile(worker.fault, '');
    expect(await failureOf(generate(server.client))).toMatchObject({ status: 500, code: 'gpu_fault' });
    // Before, it stayed up and unready for good, and its slot served nothing again.
    await expect.poll(() => ready().length, { timeout: 60_000 }).toBe(before + 1);
    expect(existsSync(worker.hang)).toBe(false);
    expect(logs.lines.map((line) => line.msg)).toContainEqual(expect.stringMatching(/^worker process ended itself after a GPU fault \(CUDA failure 700: [^)]*\), after which CUDA cannot be used by the process that met it, and was killed: it had not exited 5 s after saying so; starting a replacement$/));
    const res = await generate(server.client);
    expect(res.data).toHaveLength(1);
  });
  it('met as a model loads (its weights copied to the GPU) is a GPU fault too, not a model that cannot be loaded', async () => {
    const before = ready().length;
    await writeFile(worker.loadFault, '');
    const turbo = server.client.images.generate({ model: 'turbo', prompt: 'a red circle', size: '256x256', response_format: 'b64_json' });
    // Before, this was 500 model_unusable ("installed but could not be loaded"), and the worker stayed on, failing every load and run after.
    const { status, code, message } = await apiError(turbo, OpenAI.InternalServerError);
    expect(existsSync(worker.loadFault)).toBe(false);
    expect([status, code]).toEqual([500, 'gpu_fault']);
    expect(message).toMatch(/^500 The GPU failed while model 'turbo' made this image: [\w-]+\/model\.onnx \(as its weights were copied to the GPU\): CUDA failure 700: an illegal memory access was encountered\. /);
    await expect.poll(() => ready().length, { timeout: 60_000 }).toBe(before + 1);
    // Not the model's fault: nothing logs it as a model that failed to load, and its replacement loads it.
    expect(logs.lines.map((line) => line.msg)).not.toContain('model failed to load');
    const res = await server.client.images.generate({ model: 'turbo', prompt: 'a red circle', size: '256x256', response_format: 'b64_json' });
    expect(await sizeOf(res)).toEqual([256, 256]);
  });
});

describe('a GPU fault while a starting worker preloads a model', () => {
  it.each([
    // The first session run is the calibration of the preloaded model, on a fresh DATA_DIR.
    ['as it calibrates the model', 'fault'],
    ['as it loads the model', 'loadFault'],
  ] as const)('%s ends that worker before it is ready, saying why; its replacement serves, and no request meets the fault', async (_, trigger) => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'gpu-fault-'));
    const worker = await faultingWorker(dir);
    // There before the worker starts.
    await writeFile(worker[trigger], '');
    const logs = capturedLogs<{ msg: string; workerPid?: number }>();
    const server = await startRealServer({ workerScript: worker.script, logger: logs.logger });
    try {
      await untilReady(server.server.url, 60_000);
      expect(existsSync(worker[trigger])).toBe(false);
      const ending = logs.lines.find((line) => line.msg.includes('ends before it is ready'));
      expect(ending?.msg).toMatch(/^[\w-]+\/model\.onnx( \(as its weights were copied to the GPU\))?: CUDA failure 700: an illegal memory access was encountered: after this GPU fault CUDA cannot be used by this worker process, which ends before it is ready; a new one replaces it$/);
      expect(ending?.msg.includes('(as its weights were copied to the GPU)')).toBe(trigger === 'loadFault');
      const ready = logs.lines.filter((line) => line.msg === 'worker ready');
      expect(ready).toHaveLength(1);
      expect(ready[0].workerPid).not.toBe(ending!.workerPid);
      // Before, the worker swallowed the calibration's fault and said it was ready (this got gpu_fault); a fault
      // as it loaded the model was logged as the model failing to load, and the worker was ready with a lost GPU.
      expect(await sizeOf(await generate(server.client))).toEqual([256, 256]);
    } finally {
      await server.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('a GPU fault while another batch waits for the worker', () => {
  it('fails only the batch it met: the one waiting runs on the replacement, not on a worker that is ending', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'gpu-fault-'));
    const worker = await faultingWorker(dir);
    try {
      await withDemoPool(
        async (pool) => {
          await writeFile(worker.fault, '');
          // Both queued before the worker hears of either; their steps differ, so they do not merge.
          const faulting = pool.generate(demoBatch({ width: 256, height: 256, steps: 1 }));
          const waiting = pool.generate(demoBatch({ width: 256, height: 256, steps: 2 }));
          await expect(faulting).rejects.toMatchObject({ name: 'GpuFaultError' });
          // Before, the queue still counted the ending worker as ready and handed this batch to no worker:
          // it failed with "internal error: the job queue started a job with no idle worker".
          expect(await waiting).toHaveLength(1);
          expect(existsSync(worker.fault)).toBe(false);
        },
        { workerScript: worker.script },
      );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
