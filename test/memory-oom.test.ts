import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { apiError } from './helpers/failures.js';
import { haveRealExports, realExport } from './helpers/real-exports.js';
import { installModels } from './helpers/real-server.js';
import { spawnServer, type ServerProcess } from './helpers/server-process.js';

/**
 * A run that runs out of memory though the plan expected it to fit (another process took the memory, or
 * a limit the plan cannot see: a container's, the GPU's). Here a data-size limit on the server and its
 * workers (ulimit -d, 2 GB) makes onnxruntime's allocations fail for real, with the machine's free
 * memory still telling the plan that a 768x512 image of the SD 1.5 export (about 4 GB to denoise with
 * guidance) fits.
 */

describe.skipIf(!haveRealExports)('a run that onnxruntime cannot allocate (needs ../shared/data/real-exports)', () => {
  let root: string;
  let server: ServerProcess;
  let client: OpenAI;
  beforeAll(async () => {
    root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-oom-'));
    await installModels(path.join(root, 'models'), { sd15: { link: realExport('sd15') } });
    server = await spawnServer(
      { PORT: '0', DATA_DIR: path.join(root, 'data'), MODELS_DIR: path.join(root, 'models'), DEFAULT_MODEL: 'sd15', PRELOAD: 'sd15', MODELS_RESCAN_SECONDS: '0' },
      { limitsKb: { data: 2_000_000 } },
    );
    client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 });
  });
  afterAll(async () => {
    server?.child.kill('SIGKILL');
    await rm(root, { recursive: true, force: true });
  });

  const generate = (size: string, guidance: number) => client.images.generate({ model: 'sd15', prompt: 'a cat', size, response_format: 'b64_json', steps: 1, guidance_scale: guidance } as never);

  it('answers 507 insufficient_memory saying what to change, and the same worker serves on', async () => {
    const error = await apiError(generate('768x512', 7.5));
    expect(error.status).toBe(507);
    expect(error.error).toMatchObject({
      code: 'insufficient_memory',
      message: expect.stringMatching(/^Model 'sd15' ran out of memory making 1 image\(s\) of 768x512 \(onnxruntime: .*(bad_alloc|Failed to allocate).*\)\. Ask for a smaller size or fewer images.*MODEL_MEMORY_BUDGET/),
    });
    // The plan learnt that this size needs more than it had to give: the same request is refused before
    // it runs (no second failed run, no second reload), while a smaller one runs.
    const again = await apiError(generate('768x512', 7.5));
    expect(again.status).toBe(507);
    expect(again.error).toMatchObject({ code: 'insufficient_memory', message: expect.stringMatching(/^Model 'sd15' needs about .* of 768x512 and batches may plan on/) });
    expect((await generate('512x512', 0)).data).toHaveLength(1);
    // Still the first worker: the failure cost the request, not the process.
    expect(server.log.some((line) => line.includes('starting a replacement'))).toBe(false);
  });
});
