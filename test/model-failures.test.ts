import { cp, readFile, rm, truncate, writeFile } from 'node:fs/promises';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { whileBatchHeld } from './helpers/busy-worker.js';
import { apiError } from './helpers/failures.js';
import { capturedLogs } from './helpers/logs.js';
import { whenRunning } from './helpers/ops-server.js';
import { startRealServer, type RealServer } from './helpers/real-server.js';
import { referenceModel } from './helpers/reference.js';

/**
 * A model that was installed and usable when its request came, and is not by the time a worker loads
 * it: damaged on disk (a graph cut short after the scan that found it whole)
 * or removed; or one whose export's graph its family's pipeline cannot feed. The client learns which,
 * instead of a bare 500.
 */

let real: RealServer;
const logs = capturedLogs<{ level: number; msg: string; model?: string; code?: string; err?: { code?: string; message?: string; cause?: { message?: string } } }>();
const modelDir = (id: string) => path.join(real.root, 'models', id);

beforeAll(async () => {
  const copy = { copy: referenceModel('sd-turbo') };
  real = await startRealServer({ models: { good: copy, damaged: copy, doomed: copy, misconfigured: copy, untokenized: copy, mismatched: copy }, env: { WORKERS: '1', PRELOAD: 'good', DEFAULT_MODEL: 'good' }, logger: logs.logger });
  // Cut short after the scan that found it usable, as a copy still being written would be.
  await truncate(path.join(modelDir('damaged'), 'text_encoder', 'model.onnx'), 2000);
  // Half written by an editor after the scan.
  await writeFile(path.join(modelDir('misconfigured'), 'scheduler', 'scheduler_config.json'), '{"_class_name": ');
  await writeFile(path.join(modelDir('untokenized'), 'tokenizer', 'tokenizer.json'), '{"model": ');
  await addUnfedInput(path.join(modelDir('mismatched'), 'unet', 'model.onnx'), 'added_input');
}, 120_000);

/** Declares one more input of the graph, which no node reads and no pipeline feeds (an export of other inputs than its family's). */
async function addUnfedInput(file: string, name: string): Promise<void> {
  const { onnx } = onnxProto;
  const model = onnx.ModelProto.decode(await readFile(file));
  model.graph!.input!.push({ name, type: { tensorType: { elemType: onnx.TensorProto.DataType.FLOAT, shape: { dim: [{ dimValue: 1 }] } } } });
  await writeFile(file, onnx.ModelProto.encode(model).finish());
}
afterAll(() => real?.close());

const generate = (model: string, extra: object = {}) =>
  real.client.images.generate({ model, prompt: 'a red circle', response_format: 'b64_json', ...extra } as OpenAI.ImageGenerateParamsNonStreaming);

describe('a model that cannot be loaded when its request runs', () => {
  it('is a 500 model_unusable naming the model and what is wrong with it (no server path), not to be retried', async () => {
    const err = await apiError(generate('damaged'));
    expect({ status: err.status, type: err.type, code: err.code }).toEqual({ status: 500, type: 'server_error', code: 'model_unusable' });
    const { message } = err.error as { message: string };
    expect(message).toMatch(/^The model 'damaged' is installed but could not be loaded: text_encoder\/model\.onnx is cut short or is not an ONNX graph .*: copy it again from the export\. Other models still work/);
    expect(message).not.toContain(real.root);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    // The other models are unaffected.
    expect((await generate('good')).data).toHaveLength(1);
  });

  it('is logged at error level once, not once per request: each request retries the load and has an info line', async () => {
    for (let i = 0; i < 4; i++) expect((await apiError(generate('damaged'))).code).toBe('model_unusable');
    const damaged = logs.lines.filter((line) => line.model === 'damaged');
    expect(damaged.filter((line) => line.msg === 'model failed to load')).toHaveLength(1);
    const errors = damaged.filter((line) => line.level >= 50 && line.msg === 'request failed' && line.err?.code === 'model_unusable');
    expect(errors).toHaveLength(1);
    // The answer's message once, the worker's error it came from beside it: before, pino appended the
    // cause's message to it, and the words of the cause were in the log twice.
    expect(errors[0].err).toMatchObject({ message: expect.stringMatching(/^The model 'damaged' is installed but could not be loaded: [^]*Other models still work[^:]*$/), cause: { message: expect.stringContaining('text_encoder') } });
    // Before, every request added an error line with a stack (2.5 KB here) and the worker's own error line.
    expect(damaged.filter((line) => line.level === 30 && line.code === 'model_unusable' && line.msg.startsWith('request failed'))).toHaveLength(
      damaged.filter((line) => line.msg === 'request completed').length - 1,
    );
  });

  it('is not logged again as a warning for each streamed request that meets it', async () => {
    for (let i = 0; i < 3; i++) {
      const stream = await real.client.images.generate({ model: 'damaged', prompt: 'a red circle', stream: true });
      await expect((async () => { for await (const _event of stream); })()).rejects.toThrow(/could not be loaded/);
    }
    const streamed = logs.lines.filter((line) => line.model === 'damaged' && line.msg.startsWith('stream ended with an error event'));
    expect(streamed.length).toBeGreaterThan(0);
    // Said at error level once a minute by the failure's own line (see above), not once per stream.
    expect(streamed.filter((line) => line.level >= 40)).toEqual([]);
  });

  it('names the file at fault relative to the model folder, whatever failed to read it', async () => {
    const err = await apiError(generate('misconfigured'));
    expect({ status: err.status, code: err.code }).toEqual({ status: 500, code: 'model_unusable' });
    const { message } = err.error as { message: string };
    expect(message).toMatch(/^The model 'misconfigured' is installed but could not be loaded: scheduler\/scheduler_config\.json is not valid JSON/);
    expect(message).not.toContain(real.root);
  });

  it('names its tokenizer when that cannot be read, whether a worker loads it or the server counts the prompt with it (gpt-image usage)', async () => {
    // The worker's load for a dall-e style answer; the server's own count of the prompt's tokens for a gpt-image one.
    for (const extra of [{}, { output_format: 'png' }]) {
      const err = await apiError(generate('untokenized', extra));
      expect({ status: err.status, code: err.code }).toEqual({ status: 500, code: 'model_unusable' });
      // Before, a bare 500: "The server had an error while processing your request".
      expect((err.error as { message: string }).message).toMatch(/^The model 'untokenized' is installed but could not be loaded: cannot load the tokenizer: tokenizer\/tokenizer\.json is not valid JSON/);
      expect((err.error as { message: string }).message).not.toContain(real.root);
    }
  });

  it("is a 500 model_unusable naming the component and the input when its export's graph is not what its family's pipeline feeds, not to be retried", async () => {
    const err = await apiError(generate('mismatched'));
    expect({ status: err.status, code: err.code }).toEqual({ status: 500, code: 'model_unusable' });
    const { message } = err.error as { message: string };
    // Before, a bare 500 that the SDKs retried: "The server had an error while processing your request".
    expect(message).toMatch(/^The model 'mismatched' is installed but cannot run: unet\/model\.onnx needs input 'added_input', which the pipeline of its model's family does not feed\. .*export it again/);
    expect(message).not.toContain(real.root);
    expect(err.headers?.get('x-should-retry')).toBe('false');
  });

  it('is a 400 saying it was removed when its folder went away while the request waited', async () => {
    const long = generate('good', { n: 4, steps: 150 });
    await whenRunning(real.server);
    // The long batch held (SIGSTOP) until the folder is gone: a machine that finished it first ran the
    // waiting request with its model still there.
    const { waiting } = await whileBatchHeld(real.server.engine, async () => {
      const failed = apiError(generate('doomed'));
      await expect.poll(() => real.server.engine.load().queued).toBe(1);
      await rm(modelDir('doomed'), { recursive: true });
      return { waiting: failed };
    });
    const err = await waiting;
    expect({ status: err.status, param: err.param, code: err.code }).toEqual({ status: 400, param: 'model', code: 'invalid_value' });
    expect((err.error as { message: string }).message).toBe("The model 'doomed' was removed from the server while this request waited for it.");
    expect((await long).data).toHaveLength(4);
  });
});

describe('a preloaded model removed while the server runs', () => {
  it('no longer holds /ready back once a worker started since cannot load it', async () => {
    await rm(modelDir('good'), { recursive: true });
    // The worker restarts (a crash, the OOM killer) and preloads what it can.
    const killed = real.server.engine.workers()[0].pid!;
    process.kill(killed, 'SIGKILL');
    // Its replacement, not the killed one before its end is seen.
    await expect.poll(() => real.server.engine.workers().find((w) => w.pid !== killed)?.ready, { timeout: 30_000, interval: 50 }).toBe(true);
    const ready = await fetch(`${real.server.url}/ready`);
    expect(ready.status).toBe(200);
    expect(((await ready.json()) as { models: unknown[] }).models).toEqual([]);
  });

  it('is loaded again once its folder is back, without a request naming it: /ready says ready with it', async () => {
    await cp(referenceModel('sd-turbo'), modelDir('good'), { recursive: true });
    // The next scan finds it (MODELS_RESCAN_SECONDS is 0 here: a request naming an unknown model scans, at
    // most every 2 s, so one sent within 2 s of the last scan, on a quick machine, would scan nothing).
    // A load balancer waiting for /ready sends nothing meanwhile; before, /ready stayed 503 with the failed load's old reason.
    await expect
      .poll(async () => (await apiError(generate('not-installed')), await fetch(`${real.server.url}/ready`)).json(), { timeout: 20_000, interval: 100 })
      .toMatchObject({ status: 'ready', models: [{ model: 'good', loadedOn: 1 }] });
    expect((await generate('good')).data).toHaveLength(1);
  });
});
