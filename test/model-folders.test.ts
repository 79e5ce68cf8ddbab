import { appendFile, cp, mkdir, mkdtemp, readdir, readFile, rm, stat, symlink, truncate, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import Fastify from 'fastify';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { OnnxModel } from '../src/runtime/onnx-model.js';
import { health } from '../src/http/health.js';
import { importModel, listModels } from '../src/install/index.js';
import { selectModelFiles } from '../src/install/model-files.js';
import { inspectModelFolder, type FolderVerdict } from '../src/models/model-folder.js';
import { externalDataFiles } from '../src/models/onnx-external-data.js';
import { ModelRegistry } from '../src/models/registry.js';
import { weightBytes } from '../src/pipelines/pipeline-cache.js';
import { WorkerRuntime } from '../src/pipelines/run.js';
import { RealEngine } from './helpers/engines.js';
import { createBuiltPool } from './helpers/cli.js';
import { renameExternalData } from './helpers/external-data.js';
import { capturedLogs } from './helpers/logs.js';
import { killServer, spawnServer } from './helpers/server-process.js';
import { haveRealExports, REAL_EXPORT_NAMES, realExport } from './helpers/real-exports.js';
import { copyOfReference, referenceModel } from './helpers/reference.js';

/**
 * Real layouts and spellings: external weights under each exporter's name, folders that cannot run
 * (missing or truncated external weights, TensorRT engines, no tokenizer, an imagegen.json that does
 * not fit), and one verdict with one reason in the registry's log, /ready and `imagegen models list`.
 */

let modelsDir: string;
beforeEach(async () => {
  modelsDir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-folders-'));
});
afterEach(() => rm(modelsDir, { recursive: true, force: true }));

const silentOutput = { write: () => true, isTTY: false as const };

/** The test file's worker pool (its servers' engine), once its worker is ready. */
async function readyEngine(): Promise<RealEngine> {
  const engine = new RealEngine();
  await expect.poll(() => engine.readiness().ready, { timeout: 30_000, interval: 20 }).toBe(true);
  return engine;
}

/** The reason of an unusable verdict (fails the test on a usable one). */
function reasonOf(verdict: FolderVerdict): string {
  if (verdict.usable) throw new Error('expected the folder to be unusable');
  return verdict.reason;
}

/** A copy of a reference model in the models folder under `id`, for the test to damage. */
async function installedCopy(family: string, id: string): Promise<string> {
  const dir = path.join(modelsDir, id);
  await cp(referenceModel(family), dir, { recursive: true });
  return dir;
}

/** A copy of a reference model (SD 1.5's by default) whose scheduler_config.json names `className` (with `fields`), keeping its training fields. */
async function withScheduler(id: string, className: string, fields: object = {}, family = 'sd15-optimum'): Promise<string> {
  const dir = await installedCopy(family, id);
  const file = path.join(dir, 'scheduler', 'scheduler_config.json');
  const config = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
  await writeFile(file, JSON.stringify({ ...config, ...fields, _class_name: className }));
  return dir;
}

describe('external weights under each exporter\'s name', () => {
  // Optimum writes model.onnx_data; ORT's and Olive's savers write model.onnx.data. sd15-fp16 has fp16 inputs and outputs.
  for (const [family, name] of [
    ['sd15-optimum', 'model.onnx_data'],
    ['sd15-fp16', 'model.onnx.data'],
  ]) {
    it(`${family} with unet/${name}: usable, loaded, counted by weightBytes and installed by import`, async () => {
      const dir = await copyOfReference(family);
      const unet = path.join(dir, 'unet', 'model.onnx');
      await renameExternalData(unet, name);
      const weights = (await stat(path.join(dir, 'unet', name))).size;
      expect(await externalDataFiles(unet)).toEqual({ files: [{ location: name, bytesNeeded: weights }], damage: undefined });

      const verdict = await inspectModelFolder(dir);
      if (!verdict.usable) throw new Error(verdict.reason);
      const session = await OnnxModel.load(verdict.layout.denoiser, { provider: 'cpu', threads: 1 });
      await session.release();

      let graphs = 0;
      for (const folder of ['text_encoder', 'unet', 'vae_decoder']) graphs += (await stat(path.join(dir, folder, 'model.onnx'))).size;
      expect(await weightBytes(verdict.layout)).toBeGreaterThanOrEqual(graphs + weights);

      expect(selectModelFiles(['unet/model.onnx', `unet/${name}`, 'unet/config.json']).selected).toContain(`unet/${name}`);
      // Import loads every session before installing: the renamed weights must arrive with their graph.
      const installed = await importModel({ modelsDir, source: dir, name: 'imported', output: silentOutput });
      expect((await stat(path.join(installed.dir, 'unet', name))).size).toBe(weights);
    });
  }

  it.skipIf(!haveRealExports)('finds no external weights in the real exports, whose graphs hold them inline, and finds them usable', async () => {
    for (const name of REAL_EXPORT_NAMES) {
      const verdict = await inspectModelFolder(realExport(name));
      expect(verdict.usable ? name : `${name}: ${verdict.reason}`).toBe(name);
      if (verdict.usable) expect(await externalDataFiles(verdict.layout.denoiser)).toEqual({ files: [], damage: undefined });
    }
  });
});

describe('folders the server cannot run', () => {
  /** The verdict on a copy of a reference model with this imagegen.json. */
  const withPreset = async (family: string, preset: object) => {
    const dir = await copyOfReference(family);
    await writeFile(path.join(dir, 'imagegen.json'), JSON.stringify(preset));
    return inspectModelFolder(dir);
  };

  it("refuses an imagegen.json that sets what the model would ignore, as a request setting it is refused: guidance for FLUX schnell, a negative prompt or guidance rescale for FLUX and LCMs", async () => {
    // Before, each was served with the setting ignored: every request ran without what its operator set.
    expect(reasonOf(await withPreset('flux-schnell', { guidance_scale: { vivid: 3.5 } }))).toBe(
      'imagegen.json: guidance_scale (vivid 3.5) does not fit this model: it is a flux-schnell model, distilled to run without guidance. Remove guidance_scale, or set it to 0',
    );
    for (const family of ['flux-dev', 'lcm']) {
      expect(reasonOf(await withPreset(family, { negative_prompt: 'blurry' }))).toMatch(/^imagegen\.json: negative_prompt does not fit this model: a [\w-]+ model runs no classifier-free batch, the only part of a generation that reads one\. Remove negative_prompt$/);
    }
    expect(reasonOf(await withPreset('flux-schnell', { negative_prompt: 'blurry', guidance_rescale: 0.7 }))).toBe(
      'imagegen.json: negative_prompt and guidance_rescale do not fit this model: a flux-schnell model runs no classifier-free batch, the only part of a generation that reads them. Remove negative_prompt and guidance_rescale',
    );
    // What the models read stays allowed: guidance for FLUX dev, up to 1 (none) for schnell; a negative prompt for SD.
    for (const [family, preset] of [['flux-dev', { guidance_scale: { vivid: 3.5 } }], ['flux-schnell', { guidance_scale: { natural: 1 } }], ['sd-turbo', { negative_prompt: 'blurry', guidance_rescale: 0.7 }]] as const) {
      expect((await withPreset(family, preset)).usable).toBe(true);
    }
  });

  it("refuses an imagegen.json key it does not take naming the keys it takes, and the key that sets a request's quality or style", async () => {
    // Before, only zod's 'Unrecognized key: "high"': an operator who wrote gpt-image's quality was not told it is hd.
    expect(reasonOf(await withPreset('sd-turbo', { steps: { high: 8 } }))).toBe(
      "imagegen.json: steps: unknown key 'high': quality high runs the hd steps, so set hd; the keys it takes are low, standard, hd",
    );
    expect(reasonOf(await withPreset('sd-turbo', { quality: 'hd', colour: 'red' }))).toBe(
      "imagegen.json: (top): unknown keys 'quality', 'colour': steps sets the steps of each quality, e.g. {\"steps\": {\"hd\": 40}}; " +
        'the keys it takes are sizes, default_size, steps, guidance_scale, scheduler, max_batch, guidance_rescale, negative_prompt',
    );
    expect(reasonOf(await withPreset('sd-turbo', { guidance_scale: { strong: 9 } }))).toBe("imagegen.json: guidance_scale: unknown key 'strong'; the keys it takes are vivid, natural");
  });

  it('bounds an imagegen.json guidance_scale as a request: one a request is refused (above 30) makes the folder invalid', async () => {
    // Before, 1e308 (or 1000) was served to every request naming that style, though the same value in a request is a 400.
    expect(reasonOf(await withPreset('sd15-optimum', { guidance_scale: { vivid: 1000 } }))).toBe('imagegen.json: guidance_scale.vivid: Too big: expected number to be <=30');
    expect((await withPreset('sd15-optimum', { guidance_scale: { vivid: 30 } })).usable).toBe(true);
  });

  it("refuses an imagegen.json whose steps for a quality its scheduler cannot run: each request for that quality would be refused for it", async () => {
    // LCM's scheduler takes at most its original_inference_steps (50): the model's own, or one the preset names.
    expect(reasonOf(await withPreset('lcm', { steps: { hd: 60 } }))).toBe(
      'imagegen.json: steps hd 60 cannot run on its scheduler: LCMScheduler: steps must be between 1 and original_inference_steps (50)',
    );
    expect(reasonOf(await withPreset('sd-turbo', { scheduler: 'lcm', steps: { standard: 4, hd: 60 } }))).toBe(
      "imagegen.json: steps hd 60 cannot run on scheduler 'lcm': LCMScheduler: steps must be between 1 and original_inference_steps (50)",
    );
    expect((await withPreset('sd-turbo', { scheduler: 'lcm', steps: { standard: 4, hd: 50 } })).usable).toBe(true);
  });

  it('names an external weights file that is missing, under either name, and one that is truncated', async () => {
    const dir = await copyOfReference('sd15-fp16');
    const unet = path.join(dir, 'unet', 'model.onnx');
    await renameExternalData(unet, 'model.onnx.data');
    await truncate(path.join(dir, 'unet', 'model.onnx.data'), 1000);
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^unet\/model\.onnx\.data is truncated \(1000 B; unet\/model\.onnx reads \d+\.\d KiB of it\): copy it again$/);
    await rm(path.join(dir, 'unet', 'model.onnx.data'));
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^unet\/model\.onnx keeps its weights in unet\/model\.onnx\.data, which is missing: copy it from the export too/);

    const optimum = await copyOfReference('sd15-optimum');
    await rm(path.join(optimum, 'unet', 'model.onnx_data'));
    expect(reasonOf(await inspectModelFolder(optimum))).toMatch(/keeps its weights in unet\/model\.onnx_data, which is missing/);
  });

  it('names external weights a graph keeps outside its own folder, which onnxruntime refuses to read', async () => {
    const dir = await copyOfReference('sd15-fp16');
    const unet = path.join(dir, 'unet', 'model.onnx');
    await renameExternalData(unet, '../weights.bin');
    expect(reasonOf(await inspectModelFolder(dir))).toBe(
      "unet/model.onnx keeps its weights in '../weights.bin', outside its own folder, where onnxruntime does not read them: export it again with its weights beside it",
    );
    // The folder is refused as it is scanned, not listed and then failing each request with a 500.
    await expect(OnnxModel.load(unet, { provider: 'cpu', threads: 1 })).rejects.toThrow(/escapes model directory/);
  });

  it('names a graph that is cut short or is no protobuf, rather than calling the folder usable until a request loads it', async () => {
    const dir = await copyOfReference('sd-turbo');
    const unet = path.join(dir, 'unet', 'model.onnx');
    await truncate(unet, Math.floor((await stat(unet)).size / 2));
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^unet\/model\.onnx is cut short or is not an ONNX graph \(a field runs past the end of its message\): copy it again from the export$/);
    await writeFile(unet, Buffer.from([0x0f, 0x0f, 0x0f, 0x0f]));
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^unet\/model\.onnx is cut short or is not an ONNX graph \(not a protobuf message/);
  });

  it('names a graph padded with zero bytes (a copy whose tail was never written), which onnxruntime refuses to load', async () => {
    const dir = await copyOfReference('sd-turbo');
    const decoder = path.join(dir, 'vae_decoder', 'model.onnx');
    await appendFile(decoder, Buffer.alloc(4096));
    // A zero byte is a field numbered 0, which no protobuf message has: the walk took the run as empty fields and the folder as usable.
    await expect(OnnxModel.load(decoder, { provider: 'cpu', threads: 1 })).rejects.toThrow(/Protobuf parsing failed/);
    expect(reasonOf(await inspectModelFolder(dir))).toBe('vae_decoder/model.onnx is cut short or is not an ONNX graph (a field numbered 0: zero bytes where a field belongs): copy it again from the export');
  });

  it("checks the VAE encoder's graph too, which only edits load: a damaged one is named as the folder is scanned, not by every edit's 500", async () => {
    const dir = await copyOfReference('sd15-optimum');
    const encoder = path.join(dir, 'vae_encoder', 'model.onnx');
    await truncate(encoder, Math.floor((await stat(encoder)).size / 2));
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^vae_encoder\/model\.onnx is cut short or is not an ONNX graph \(.+\): copy it again from the export$/);
  });

  it('recognises TensorRT engines and says to export ONNX instead; installs leave engine files out', async () => {
    const dir = await copyOfReference('sdxl');
    await rm(path.join(dir, 'unet'), { recursive: true });
    await mkdir(path.join(dir, 'unet'));
    await writeFile(path.join(dir, 'unet', 'model.plan'), 'serialized engine');
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^it holds TensorRT engines \(unet\/model\.plan\) instead of ONNX graphs.*optimum-cli export onnx/);
    expect(selectModelFiles(['unet/model.onnx', 'unet/model.engine', 'unet/model.trt']).selected).toEqual(['unet/model.onnx']);
  });

  it('installs model.onnx and its weights, not the other exports of a component beside it (fp16, quantized), which the engine never reads', () => {
    const listed = ['unet/model.onnx', 'unet/model.onnx_data', 'unet/model_fp16.onnx', 'unet/model_fp16.onnx_data', 'unet/model_quantized.onnx', 'unet/model_fp16.onnx.data', 'unet/weights.pb', 'unet/config.json'];
    expect(selectModelFiles(listed)).toEqual({
      selected: ['unet/model.onnx', 'unet/model.onnx_data', 'unet/weights.pb', 'unet/config.json'],
      skipped: ['unet/model_fp16.onnx', 'unet/model_fp16.onnx_data', 'unet/model_quantized.onnx', 'unet/model_fp16.onnx.data'],
    });
    // A folder with no model.onnx keeps what it has: the layout's check then names the missing graph.
    expect(selectModelFiles(['unet/model_fp16.onnx', 'unet/config.json']).selected).toEqual(['unet/model_fp16.onnx', 'unet/config.json']);
  });

  it("rejects an imagegen.json asking more steps than the API's limit, naming the field", async () => {
    const dir = await copyOfReference('sd-turbo');
    await writeFile(path.join(dir, 'imagegen.json'), JSON.stringify({ steps: { standard: 100_000 } }));
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^imagegen\.json: steps\.standard: .*150/);
  });

  it('reads an imagegen.json and configs saved with a byte-order mark, as Windows editors save UTF-8, which JSON.parse refused with an invisible character', async () => {
    const dir = await copyOfReference('sd-turbo');
    await writeFile(path.join(dir, 'imagegen.json'), `\uFEFF${JSON.stringify({ sizes: ['256x256', '512x512'], max_batch: 3 })}`);
    const config = path.join(dir, 'scheduler', 'scheduler_config.json');
    await writeFile(config, `\uFEFF${await readFile(config, 'utf8')}`);
    const verdict = await inspectModelFolder(dir);
    if (!verdict.usable) throw new Error(verdict.reason);
    expect([verdict.preset.sizes, verdict.preset.maxBatch]).toEqual([['256x256', '512x512'], 3]);
  });

  it('rejects an imagegen.json a hand edit left no JSON as a problem of imagegen.json, saying where and what: a comment, a trailing comma', async () => {
    const dir = await copyOfReference('sd-turbo');
    await writeFile(path.join(dir, 'imagegen.json'), '{\n  // tuned for the A10s\n  "max_batch": 3\n}\n');
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^imagegen\.json: not valid JSON \(.* at position 4, line 2 column 3: a comment, which JSON does not allow: remove it\)$/);
    await writeFile(path.join(dir, 'imagegen.json'), '{\n  "sizes": ["512x512"],\n  "max_batch": 3,\n}\n');
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^imagegen\.json: not valid JSON \(.* at position 44, line 4 column 1: a comma before the closing bracket, which JSON does not allow: remove it\)$/);
  });

  it('rejects an imagegen.json saved as UTF-16 (as Windows PowerShell 5 saves text) for how it is saved, where it was a JSON token that is not one', async () => {
    const dir = await copyOfReference('sd-turbo');
    await writeFile(path.join(dir, 'imagegen.json'), Buffer.from(`\uFEFF${JSON.stringify({ max_batch: 3 })}`, 'utf16le'));
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^imagegen\.json: saved as UTF-16 .*: save it as UTF-8$/);
  });

  it('rejects an fp16 export without its tokenizer (as GPU-only exports ship) by saying what is missing', async () => {
    const dir = await copyOfReference('sd15-fp16');
    await rm(path.join(dir, 'tokenizer'), { recursive: true });
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(/^missing tokenizer\/ \(tokenizer\.json or vocab\.json \+ merges\.txt\)$/);
  });
});

describe('rescans', () => {
  it('see a file finished or replaced inside a component folder, and reload sessions only when weights or configs changed', async () => {
    const dir = await installedCopy('sd15-optimum', 'copying');
    const weights = path.join(dir, 'unet', 'model.onnx_data');
    const whole = await readFile(weights);
    // The copy's last file is still being written when the server scans.
    await writeFile(weights, whole.subarray(0, whole.length >> 1));
    const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }], aliases: {}, logger: capturedLogs().logger, minRescanIntervalMs: 0 });
    await registry.scan();
    expect(registry.unusable().map((u) => u.reason)).toEqual([expect.stringMatching(/unet\/model.onnx_data is truncated/)]);
    // The rest arrives: neither the model's folder nor unet/ changes its mtime, only the file does.
    const folderTimes = [await stat(dir), await stat(path.join(dir, 'unet'))].map((info) => info.mtimeMs);
    await appendFile(weights, whole.subarray(whole.length >> 1));
    expect([await stat(dir), await stat(path.join(dir, 'unet'))].map((info) => info.mtimeMs)).toEqual(folderTimes);
    await registry.scan();
    const first = await registry.resolve('copying');
    expect(registry.unusable()).toEqual([]);
    expect(first).toBeDefined();

    // A preset edited: served at once, and the same sessions (version) serve it.
    await writeFile(path.join(dir, 'imagegen.json'), JSON.stringify({ sizes: ['256x256'], default_size: '256x256' }));
    await registry.scan();
    const preset = (await registry.resolve('copying'))!;
    expect(preset.preset.sizes).toEqual(['256x256']);
    expect(preset.version).toBe(first!.version);
    // A config edited in place: inspected again (here refused), and a new version once usable.
    const scheduler = path.join(dir, 'scheduler', 'scheduler_config.json');
    const config = await readFile(scheduler, 'utf8');
    await writeFile(scheduler, JSON.stringify({ ...JSON.parse(config), beta_schedule: 'no_such_schedule' }));
    await registry.scan();
    expect(registry.unusable().map((u) => u.reason)).toEqual([expect.stringMatching(/no_such_schedule/)]);
    await writeFile(scheduler, config);
    await registry.scan();
    expect((await registry.resolve('copying'))!.version).not.toBe(first!.version);
  });
});

describe('links in the models folder that lead to no model folder', () => {
  it('are skipped with the same reason by the registry (logged once) and by "imagegen models list"', async () => {
    await installedCopy('sd-turbo', 'good');
    await symlink(path.join(modelsDir, 'nowhere'), path.join(modelsDir, 'dangling'));
    await symlink('loop2', path.join(modelsDir, 'loop1'));
    await symlink('loop1', path.join(modelsDir, 'loop2'));
    await writeFile(path.join(modelsDir, 'notes.txt'), 'a file');
    await symlink('notes.txt', path.join(modelsDir, 'to-a-file'));
    const logs = capturedLogs<{ msg: string; model?: string }>();
    const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }], aliases: {}, logger: logs.logger, minRescanIntervalMs: 0 });
    await registry.scan();
    await registry.scan();
    const reasons = Object.fromEntries(registry.unusable().map(({ id, reason }) => [id, reason]));
    expect(reasons).toEqual({
      dangling: 'a symbolic link to nothing that can be read (ENOENT): remove it or point it at a model folder',
      loop1: 'a symbolic link to nothing that can be read (ELOOP): remove it or point it at a model folder',
      loop2: 'a symbolic link to nothing that can be read (ELOOP): remove it or point it at a model folder',
      'to-a-file': 'a link to a file, not to a model folder: remove it or point it at a model folder',
    });
    expect(logs.lines.filter((line) => line.msg.startsWith('skipping model: '))).toHaveLength(4);
    const listed = await listModels(modelsDir);
    expect(Object.fromEntries(listed.filter((m) => m.status === 'broken').map((m) => [m.id, m.reason]))).toEqual(reasons);
    expect(registry.list().map((m) => m.id)).toEqual(['good']);
  });

  it("hide a model of the same id in a later root (the embedded one) rather than fall back to it unsaid", async () => {
    const embedded = await mkdtemp(path.join(os.tmpdir(), 'imagegen-embedded-'));
    try {
      await cp(referenceModel('sd-turbo'), path.join(embedded, 'demo'), { recursive: true });
      await symlink(path.join(modelsDir, 'nowhere'), path.join(modelsDir, 'demo'));
      const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }, { dir: embedded, ownedBy: 'imagegen' }], aliases: {}, logger: capturedLogs().logger });
      await registry.scan();
      expect(await registry.resolve('demo')).toBeUndefined();
      expect(registry.unusableReason('demo')).toMatch(/^a symbolic link to nothing/);
    } finally {
      await rm(embedded, { recursive: true, force: true });
    }
  });
});

describe('a models folder that does not exist', () => {
  it('is said once, not at every rescan, and its models are served once it appears', async () => {
    const missing = path.join(modelsDir, 'not-yet');
    const logs = capturedLogs<{ msg: string }>();
    const registry = new ModelRegistry({ roots: [{ dir: missing, ownedBy: 'user' }], aliases: {}, logger: logs.logger });
    await registry.scan();
    await registry.scan();
    expect(logs.lines.filter((line) => line.msg.includes('does not exist'))).toEqual([expect.objectContaining({ msg: expect.stringMatching(/^the models folder .*not-yet does not exist: none of its models are served until it does/) })]);
    await cp(referenceModel('sd-turbo'), path.join(missing, 'late'), { recursive: true });
    await registry.scan();
    expect(registry.list().map((m) => m.id)).toEqual(['late']);
  });
});

describe('a models folder that is a file', () => {
  it('says why it cannot be read, in the message (imagegen generate shows only that), once', async () => {
    const file = path.join(modelsDir, 'a-file');
    await writeFile(file, 'not a folder');
    const logs = capturedLogs<{ msg: string }>();
    const registry = new ModelRegistry({ roots: [{ dir: file, ownedBy: 'user' }], aliases: {}, logger: logs.logger });
    // Once, not at every rescan.
    await registry.scan();
    await registry.scan();
    expect(logs.lines.map((line) => line.msg)).toEqual([expect.stringMatching(/^the models folder .*a-file cannot be read \(ENOTDIR: not a directory.*\): none of its models are served until it can; check MODELS_DIR$/)]);
  });
});

describe('MODELS_DIR set to a model folder itself', () => {
  it('is said once, naming what to point it at and how to install it instead; its components are not skipped one by one as models', async () => {
    const model = await installedCopy('sd-turbo', 'only');
    const logs = capturedLogs<{ msg: string }>();
    const registry = new ModelRegistry({ roots: [{ dir: model, ownedBy: 'user' }], aliases: {}, logger: logs.logger });
    await registry.scan();
    await registry.scan();
    expect(logs.lines.map((line) => line.msg)).toEqual([
      `the models folder ${model} is a model folder itself (it has model_index.json; its sub-folders are that model's parts): point MODELS_DIR at the folder that holds model folders, one per model (such as ${path.dirname(model)}), or install this one into yours with "imagegen models import ${model}"`,
    ]);
    expect(registry.list()).toEqual([]);
  });
});

describe('MODELS_DIR set one level above the models folder', () => {
  it('names the models it holds and what to set, where "missing unet/model.onnx, ..." read as a model to repair, in the log and "imagegen models list" alike', async () => {
    // MODELS_DIR=/media/usb where the exports lie in /media/usb/exports/: "exports" is taken for a model.
    const exports = path.join(modelsDir, 'exports');
    await cp(referenceModel('sd-turbo'), path.join(exports, 'sd-turbo'), { recursive: true });
    await cp(referenceModel('sd15-optimum'), path.join(exports, 'sd15'), { recursive: true });
    await mkdir(path.join(exports, '.staging', 'partial', 'unet'), { recursive: true });
    await writeFile(path.join(exports, '.staging', 'partial', 'unet', 'model.onnx'), '');
    await mkdir(path.join(exports, 'notes'));
    const reason =
      "it holds model folders (sd-turbo, sd15), one per model, rather than a model's parts: to serve them, set MODELS_DIR to this folder itself; to install or verify one, give its own folder";
    expect(reasonOf(await inspectModelFolder(exports))).toBe(reason);
    const logs = capturedLogs<{ msg: string; model?: string }>();
    const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }], aliases: {}, logger: logs.logger });
    await registry.scan();
    expect(registry.unusable()).toMatchObject([{ id: 'exports', reason }]);
    expect(logs.lines).toMatchObject([{ model: 'exports', msg: `skipping model: ${reason}` }]);
    expect(await listModels(modelsDir)).toMatchObject([{ id: 'exports', status: 'broken', reason }]);
    // A folder that is neither still says what it misses.
    expect(reasonOf(await inspectModelFolder(path.join(exports, 'notes')))).toMatch(/^missing unet\/model.onnx or transformer\/model.onnx/);
  });
});

describe('aliases', () => {
  it('give way to an installed model of the same name in lookups as in the list, and the scan says so, as it says which name nothing', async () => {
    await installedCopy('sd-turbo', 'good');
    await installedCopy('sd-turbo', 'dall-e-3');
    const logs = capturedLogs<{ msg: string }>();
    const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }], aliases: { 'dall-e-3': 'good', 'dall-e-2': 'good', chained: 'dall-e-2' }, logger: logs.logger });
    await registry.scan();
    expect((await registry.resolve('dall-e-3'))!.id).toBe('dall-e-3');
    expect((await registry.resolve('dall-e-2'))!.id).toBe('good');
    expect(registry.list().map(({ id, model }) => [id, model.id])).toEqual([
      ['dall-e-3', 'dall-e-3'],
      ['good', 'good'],
      ['dall-e-2', 'good'],
    ]);
    expect(logs.lines.map((line) => line.msg)).toContain("the alias 'dall-e-3' is hidden by the installed model 'dall-e-3', which requests for 'dall-e-3' get: rename that model folder, or drop the alias");
    // An alias of an alias answers nothing, and the log says why.
    expect(await registry.resolve('chained')).toBeUndefined();
    expect(logs.lines.map((line) => line.msg)).toContain("the alias 'chained' names 'dall-e-2', which is not an installed model's id: it answers nothing until such a model is installed (MODEL_ALIASES, DEFAULT_MODEL)");
  });

  it('naming a model folder the scan skipped, are logged with why it is skipped, not as naming no installed model', async () => {
    // Before: "which is not an installed model's id ... until such a model is installed", for a folder that is there.
    await installedCopy('sd-turbo', 'good');
    const dir = await installedCopy('sd-turbo', 'tuned');
    await writeFile(path.join(dir, 'imagegen.json'), '{"max_batch": 0}');
    const logs = capturedLogs<{ msg: string }>();
    const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }], aliases: { 'dall-e-3': 'tuned' }, logger: logs.logger });
    await registry.scan();
    expect(logs.lines.map((line) => line.msg)).toContain(
      "the alias 'dall-e-3' names 'tuned', which is installed but cannot be used (imagegen.json: max_batch: Too small: expected number to be >=1): it answers nothing until its folder is repaired (MODEL_ALIASES, DEFAULT_MODEL)",
    );
  });
});

describe('one verdict for the registry, its log, /ready, "imagegen models list" and installs', () => {
  it("says in the server's log that DEFAULT_MODEL or PRELOAD names a model installed but unusable, and why, not that it is not installed", async () => {
    const misfit = await installedCopy('sd-turbo', 'misfit');
    await writeFile(path.join(misfit, 'imagegen.json'), JSON.stringify({ sizes: ['500x500'] }));
    const server = await spawnServer({ PORT: '0', DATA_DIR: path.join(modelsDir, '.data'), MODELS_DIR: modelsDir, DEFAULT_MODEL: 'misfit', PRELOAD: 'misfit,absent' });
    try {
      const messages = server.log.map((line) => (JSON.parse(line) as { msg: string }).msg);
      const reason = 'imagegen.json: sizes 500x500 do not fit this model: both sides must be multiples of 64 (from its unet/transformer and vae configs)';
      expect(messages).toContainEqual(expect.stringMatching(/^default model 'misfit' is installed but cannot be used \(imagegen\.json: sizes 500x500 do not fit [^\n]*\): requests that name no model, and those for dall-e-2, .*, will fail until it can be used$/));
      expect(messages).toContain(`PRELOAD names 'misfit', which is installed but cannot be used (${reason}): not preloading it`);
      expect(messages).toContain("PRELOAD names 'absent', which is not installed: not preloading it");
    } finally {
      await killServer(server);
    }
  });

  it('gives each unusable folder the same reason everywhere, and serves only the usable ones', async () => {
    await installedCopy('sd-turbo', 'good');
    // Accepted by the layout alone, which is what "models list" used to check: the server skips it.
    const misfit = await installedCopy('sd-turbo', 'misfit');
    await writeFile(path.join(misfit, 'imagegen.json'), JSON.stringify({ sizes: ['500x500'] }));
    const noWeights = await installedCopy('sd15-optimum', 'no-weights');
    await rm(path.join(noWeights, 'unet', 'model.onnx_data'));
    const engines = await installedCopy('sd-turbo', 'engines');
    await rm(path.join(engines, 'unet', 'model.onnx'));
    await writeFile(path.join(engines, 'unet', 'unet.engine'), 'serialized engine');

    const logs = capturedLogs<{ msg: string; model?: string }>();
    const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }], aliases: {}, logger: logs.logger });
    await registry.scan();
    expect(registry.list().map((m) => m.id)).toEqual(['good']);

    const listed = await listModels(modelsDir);
    const unusable = registry.unusable();
    expect(unusable.map((u) => u.id)).toEqual(['engines', 'misfit', 'no-weights']);
    expect(listed.filter((m) => m.status === 'broken').map((m) => ({ id: m.id, reason: m.reason }))).toEqual(unusable.map(({ id, reason }) => ({ id, reason })));
    const skipped = logs.lines.filter((line) => line.msg.startsWith('skipping model: ')).map((line) => ({ id: line.model, reason: line.msg.slice('skipping model: '.length) }));
    expect(skipped).toEqual(unusable.map(({ id, reason }) => ({ id, reason })));
    expect(unusable.find((u) => u.id === 'misfit')!.reason).toBe('imagegen.json: sizes 500x500 do not fit this model: both sides must be multiples of 64 (from its unet/transformer and vae configs)');

    const app = Fastify();
    await app.register(health, { engine: await readyEngine(), registry });
    const ready = await app.inject({ method: 'GET', url: '/ready' });
    expect(ready.statusCode).toBe(200);
    expect(ready.json()).toEqual({
      status: 'ready',
      workers: { total: 1, ready: 1 },
      models: [],
      unusable: unusable.map(({ id, reason }) => ({ model: id, reason })),
    });
    // /ready needs no key: a peer elsewhere (a load balancer) gets the status, not the folders and reasons.
    const remote = await app.inject({ method: 'GET', url: '/ready', remoteAddress: '203.0.113.5' });
    expect(remote.json()).toEqual({ status: 'ready', workers: { total: 1, ready: 1 }, models: [] });
    // Nor does one a proxy on the machine brings, which TRUST_PROXY does not name (here: unset).
    const proxied = await app.inject({ method: 'GET', url: '/ready', headers: { 'x-forwarded-for': '203.0.113.5' } });
    expect(proxied.json()).toEqual({ status: 'ready', workers: { total: 1, ready: 1 }, models: [] });
    // Nor one a proxy brings that names no client, only the address it used (X-Forwarded-Host and -Proto alone).
    const unnamed = await app.inject({ method: 'GET', url: '/ready', headers: { 'x-forwarded-host': 'localhost', 'x-forwarded-proto': 'https' } });
    expect(unnamed.json()).toEqual({ status: 'ready', workers: { total: 1, ready: 1 }, models: [] });
    // Nor a web page in a browser on the machine: one whose own name was rebound to 127.0.0.1 (its Host),
    // or one of another site that CORS_ORIGINS lets read answers (its Origin).
    const rebound = await app.inject({ method: 'GET', url: '/ready', headers: { host: 'attacker.example:8000' } });
    expect(rebound.json()).toEqual({ status: 'ready', workers: { total: 1, ready: 1 }, models: [] });
    const page = await app.inject({ method: 'GET', url: '/ready', headers: { origin: 'https://attacker.example' } });
    expect(page.json()).toEqual({ status: 'ready', workers: { total: 1, ready: 1 }, models: [] });
    const ownPage = await app.inject({ method: 'GET', url: '/ready', headers: { host: '[::1]:8000', origin: 'http://localhost:3000' } });
    expect(ownPage.json().unusable).toHaveLength(unusable.length);
    await app.close();

    // A server whose model to preload fails to load (its weights went after the scan): /ready says why, with the path, to a local peer only.
    const good = path.join(modelsDir, 'good');
    await rm(path.join(good, 'unet', 'model.onnx'));
    const starting = createBuiltPool({ workers: 1, queueMax: 1, executionProvider: 'cpu', threadsPerWorker: 1, preload: [{ dir: good }] });
    const notReady = Fastify();
    try {
      await notReady.register(health, { engine: starting, registry });
      await expect.poll(() => starting.readiness().models[0]?.error, { timeout: 30_000, interval: 20 }).toBeDefined();
      const [here, elsewhere] = await Promise.all(['127.0.0.1', '203.0.113.5'].map((remoteAddress) => notReady.inject({ method: 'GET', url: '/ready', remoteAddress })));
      expect([here.statusCode, elsewhere.statusCode]).toEqual([503, 503]);
      expect(here.json().error.message).toContain(`model 'good' failed to load: ${good} is not a usable model folder: missing unet/model.onnx`);
      expect(elsewhere.json().error).toEqual({ message: expect.stringMatching(/^The server is starting and cannot generate yet; the server's log says why/), type: 'server_error', param: null, code: 'not_ready' });
      expect(elsewhere.headers['retry-after']).toBe('5');
    } finally {
      await notReady.close();
      await starting.close();
    }

    // An install refuses what the server would skip, with the same reason.
    const refused = await importModel({ modelsDir, source: misfit, name: 'misfit-copy', load: false, output: silentOutput }).catch((err: Error) => err);
    expect((refused as Error).message).toContain(unusable.find((u) => u.id === 'misfit')!.reason);
    expect(await readdir(modelsDir)).not.toContain('misfit-copy');
  });

  it('leaves /ready as it was when every folder is usable', async () => {
    await installedCopy('sd-turbo', 'good');
    const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }], aliases: {}, logger: capturedLogs().logger });
    await registry.scan();
    const app = Fastify();
    await app.register(health, { engine: await readyEngine(), registry });
    expect((await app.inject({ method: 'GET', url: '/ready' })).json()).toEqual({ status: 'ready', workers: { total: 1, ready: 1 }, models: [] });
    await app.close();
  });
});

describe("a model's scheduler_config.json", () => {
  it("is read as Python's json module writes it (diffusers saves DPM-Solver's lambda_min_clipped as -Infinity)", async () => {
    const dir = await installedCopy('sd15-optimum', 'python-json');
    const file = path.join(dir, 'scheduler', 'scheduler_config.json');
    const config = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
    await writeFile(file, JSON.stringify({ ...config, _class_name: 'DPMSolverMultistepScheduler', lambda_min_clipped: 'NEG_INF' }).replace('"NEG_INF"', '-Infinity'));
    const verdict = await inspectModelFolder(dir);
    if (!verdict.usable) throw new Error(verdict.reason);
    expect(verdict.layout.scheduler.lambda_min_clipped).toBe(-Infinity);
  });

  it('is refused at load for a value only a schedule reads, rather than failing every request', async () => {
    const dir = await installedCopy('sd15-optimum', 'bad-spacing');
    const file = path.join(dir, 'scheduler', 'scheduler_config.json');
    await writeFile(file, JSON.stringify({ ...JSON.parse(await readFile(file, 'utf8')), timestep_spacing: 'sideways' }));
    expect(await inspectModelFolder(dir)).toMatchObject({ usable: false, reason: expect.stringMatching(/scheduler_config\.json: timestep_spacing "sideways" is not supported/) });
  });

  it('is refused at load when it sets rescale_betas_zero_snr for an epsilon model whose DDIM starts at pure noise, saying what runs', async () => {
    const dir = await installedCopy('sd15-optimum', 'epsilon-zero-snr');
    const file = path.join(dir, 'scheduler', 'scheduler_config.json');
    const config = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
    await writeFile(file, JSON.stringify({ ...config, _class_name: 'DDIMScheduler', timestep_spacing: 'trailing', rescale_betas_zero_snr: true }));
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(
      /scheduler_config\.json: DDIMScheduler: prediction_type "epsilon" cannot denoise timestep 999, .*prediction_type "v_prediction".*euler scheduler/,
    );
    // With Euler, which keeps that noise level finite (sigma ~4096) as diffusers does, it loads; DDIM, LCM and PNDM are not offered,
    // and the log of the scan and `imagegen models list` say why, once.
    await writeFile(file, JSON.stringify({ ...config, _class_name: 'EulerDiscreteScheduler', timestep_spacing: 'trailing', rescale_betas_zero_snr: true }));
    const verdict = await inspectModelFolder(dir);
    if (!verdict.usable) throw new Error(verdict.reason);
    expect(verdict.schedulers).toEqual(['euler', 'euler_a', 'dpmpp_2m', 'dpmpp_2m_karras']);
    expect(verdict.refusedSchedulers.map((refused) => refused.name)).toEqual(['pndm', 'ddim', 'lcm']);
    const note = new RegExp(
      'schedulers not offered, as its scheduler_config\\.json does not run on them: pndm \\(PNDMScheduler: rescale_betas_zero_snr=true is not supported\\); ' +
        'ddim \\(DDIMScheduler: prediction_type "epsilon" cannot denoise timestep 999.*\\); lcm \\(LCMScheduler: prediction_type "epsilon"',
    );
    expect(await listModels(modelsDir)).toMatchObject([{ id: 'epsilon-zero-snr', status: 'ok', reason: expect.stringMatching(note) }]);
    const logs = capturedLogs<{ model?: string; msg: string }>();
    const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }], aliases: {}, logger: logs.logger });
    await registry.scan();
    await registry.scan();
    registry.close();
    expect(logs.lines.filter((line) => line.model === 'epsilon-zero-snr').map((line) => line.msg)).toEqual([expect.stringMatching(note)]);
    // An imagegen.json asking for one of them is told why too.
    await writeFile(path.join(dir, 'imagegen.json'), JSON.stringify({ scheduler: 'ddim' }));
    expect(reasonOf(await inspectModelFolder(dir))).toMatch(
      /^imagegen\.json: scheduler 'ddim' does not fit this model \(DDIMScheduler: prediction_type "epsilon" cannot denoise timestep 999.*\); use one of euler, euler_a, dpmpp_2m, dpmpp_2m_karras$/,
    );
  });
});

describe("exponential and beta sigmas in a model's scheduler_config.json", () => {
  it('load and draw as the config asks, on the class that has them and on a stand-in for a class this server does not run', async () => {
    const exponential = await withScheduler('euler-exponential', 'EulerDiscreteScheduler', { use_exponential_sigmas: true });
    // UniPC's own exponential sigmas carry over to Euler standing in for it (it was refused with them before).
    const unipc = await withScheduler('unipc-exponential', 'UniPCMultistepScheduler', { use_exponential_sigmas: true, solver_order: 2, solver_type: 'bh2' });
    const beta = await withScheduler('dpm-beta', 'DPMSolverMultistepScheduler', { use_beta_sigmas: true });
    const plain = await withScheduler('euler', 'EulerDiscreteScheduler');
    for (const dir of [exponential, beta]) {
      const verdict = await inspectModelFolder(dir);
      if (!verdict.usable) throw new Error(verdict.reason);
      expect([verdict.layout.schedulerStandIn, verdict.refusedSchedulers]).toEqual([undefined, []]);
      expect(verdict.schedulers).toEqual(['pndm', 'ddim', 'euler', 'euler_a', 'dpmpp_2m', 'dpmpp_2m_karras', 'lcm']);
    }
    const standIn = await inspectModelFolder(unipc);
    expect(standIn.usable && standIn.layout.schedulerStandIn).toEqual({ named: 'UniPCMultistepScheduler', by: 'euler' });

    const runtime = new WorkerRuntime();
    const draw = async (modelDir: string) => {
      const [image] = await runtime.generateImages({ modelDir, width: 64, height: 64, steps: 4, guidanceScale: 5, items: [{ prompt: 'a red circle', negativePrompt: '', seed: 3 }] });
      return Buffer.from(image.pixels);
    };
    const [fromExponential, fromStandIn, fromBeta, fromPlain] = [await draw(exponential), await draw(unipc), await draw(beta), await draw(plain)];
    expect(fromStandIn.equals(fromExponential)).toBe(true);
    // Other noise levels, another picture: the setting is read, not dropped.
    expect(fromExponential.equals(fromPlain)).toBe(false);
    expect(fromBeta.equals(fromPlain)).toBe(false);
  });

  it('load and draw on FLUX, and two spacings at once are refused at load, as diffusers refuses them', async () => {
    const flux = await withScheduler('flux-beta', 'FlowMatchEulerDiscreteScheduler', { use_beta_sigmas: true }, 'flux-schnell');
    const verdict = await inspectModelFolder(flux);
    if (!verdict.usable) throw new Error(verdict.reason);
    const runtime = new WorkerRuntime();
    const draw = async (modelDir: string) => {
      const [image] = await runtime.generateImages({ modelDir, width: 64, height: 64, steps: 4, guidanceScale: 0, items: [{ prompt: 'a red circle', negativePrompt: '', seed: 3 }] });
      return Buffer.from(image.pixels);
    };
    expect((await draw(flux)).equals(await draw(referenceModel('flux-schnell')))).toBe(false);

    const both = await withScheduler('both', 'EulerDiscreteScheduler', { use_karras_sigmas: true, use_exponential_sigmas: true });
    expect(reasonOf(await inspectModelFolder(both))).toMatch(
      /scheduler_config\.json: EulerDiscreteScheduler: use_karras_sigmas and use_exponential_sigmas are set together, and a schedule takes one of them: set the others to false/,
    );
  });
});

describe("text of a model's own files, as printed", () => {
  it('carries no terminal control sequences: a class name or imagegen.json key from a pulled repository cannot drive the terminal of `imagegen models list`', async () => {
    // What anyone publishing a repository on the Hub can write: a title change, a screen cleared, colour.
    const escapes = '\x1b]0;pwned\x07\x1b[2J\x1b[31mEvil\u009b0m\u202e';
    await withScheduler('stand-in', `${escapes}Scheduler`);
    const broken = await installedCopy('sd15-optimum', 'broken');
    await writeFile(path.join(broken, 'imagegen.json'), JSON.stringify({ [`${escapes}sizes`]: ['64x64'] }));
    const listed = await listModels(modelsDir);
    const reasons = ['stand-in', 'broken'].map((id) => listed.find((m) => m.id === id)?.reason ?? '');
    expect(reasons[0]).toMatch(/its scheduler_config\.json names \\u001b\]0;pwned\\u0007\\u001b\[2J\\u001b\[31mEvil\\u009b0m\\u202eScheduler, which this server does not run/);
    expect(reasons[1]).toMatch(/^imagegen\.json: .*unknown key '\\u001b\]0;pwned/);
    for (const reason of reasons) expect(reason).not.toMatch(/[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/);
  });
});

describe('a scheduler class this server does not run', () => {
  it('leaves the model usable, with Euler standing in on the same training schedule, said in the log and by `imagegen models list`; the picture is what the same config as Euler makes', async () => {
    // UniPC as diffusers writes it: its solver fields mean nothing to the stand-in.
    const unipc = await withScheduler('unipc', 'UniPCMultistepScheduler', { solver_order: 2, solver_type: 'bh2', predict_x0: true, lower_order_final: true, disable_corrector: [] });
    const euler = await withScheduler('euler', 'EulerDiscreteScheduler');
    const verdict = await inspectModelFolder(unipc);
    if (!verdict.usable) throw new Error(verdict.reason);
    expect(verdict.layout.schedulerStandIn).toEqual({ named: 'UniPCMultistepScheduler', by: 'euler' });
    expect(verdict.layout.scheduler).toMatchObject({ _class_name: 'EulerDiscreteScheduler', beta_schedule: 'scaled_linear', beta_start: 0.00085 });

    const note = /its scheduler_config\.json names UniPCMultistepScheduler, which this server does not run: euler stands in/;
    const listed = await listModels(modelsDir);
    expect(listed.find((m) => m.id === 'unipc')).toMatchObject({ status: 'ok', reason: expect.stringMatching(note) });
    expect(listed.find((m) => m.id === 'euler')!.reason).toBeUndefined();
    const logs = capturedLogs<{ model?: string; msg: string }>();
    const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }], aliases: {}, logger: logs.logger });
    await registry.scan();
    registry.close();
    expect(logs.lines.filter((line) => line.model === 'unipc').map((line) => line.msg)).toEqual([expect.stringMatching(note)]);

    const runtime = new WorkerRuntime();
    const draw = (modelDir: string) =>
      runtime.generateImages({ modelDir, width: 64, height: 64, steps: 4, guidanceScale: 5, items: [{ prompt: 'a red circle', negativePrompt: '', seed: 3 }] });
    const [[fromStandIn], [fromEuler]] = [await draw(unipc), await draw(euler)];
    expect(Buffer.from(fromStandIn.pixels).equals(Buffer.from(fromEuler.pixels))).toBe(true);
  });

  it("leaves a model whose DPM-Solver config asks for what only diffusers runs (SDE, third order) usable, DPM-Solver++(2M) standing in on its sigmas", async () => {
    const karras = { use_karras_sigmas: true, solver_order: 2 };
    const sde = await withScheduler('sde', 'DPMSolverMultistepScheduler', { ...karras, algorithm_type: 'sde-dpmsolver++' });
    const verdict = await inspectModelFolder(sde);
    if (!verdict.usable) throw new Error(verdict.reason);
    expect(verdict.layout.schedulerStandIn).toEqual({ named: 'DPMSolverMultistepScheduler', by: 'dpmpp_2m_karras', why: 'algorithm_type sde-dpmsolver++' });
    const listed = await listModels(modelsDir);
    expect(listed.find((m) => m.id === 'sde')).toMatchObject({
      status: 'ok',
      reason: expect.stringMatching(/its scheduler_config\.json names DPMSolverMultistepScheduler with algorithm_type sde-dpmsolver\+\+, which this server does not run: dpmpp_2m_karras stands in/),
    });
    const third = await inspectModelFolder(await withScheduler('third', 'DPMSolverMultistepScheduler', { solver_order: 3, solver_type: 'heun' }));
    expect(third.usable && third.layout.schedulerStandIn).toEqual({ named: 'DPMSolverMultistepScheduler', by: 'dpmpp_2m', why: 'solver_type heun, solver_order 3' });
    // What runs is the model's own config as DPM-Solver++(2M) (Karras), as the request's `scheduler` picks it.
    const plain = await withScheduler('plain', 'DPMSolverMultistepScheduler', karras);
    const own = await inspectModelFolder(plain);
    expect(own.usable && own.layout.schedulerStandIn).toBeUndefined();
    const runtime = new WorkerRuntime();
    const draw = (modelDir: string) =>
      runtime.generateImages({ modelDir, width: 64, height: 64, steps: 4, guidanceScale: 5, items: [{ prompt: 'a red circle', negativePrompt: '', seed: 3 }] });
    const [[fromStandIn], [fromOwn]] = [await draw(sde), await draw(plain)];
    expect(Buffer.from(fromStandIn.pixels).equals(Buffer.from(fromOwn.pixels))).toBe(true);
  });

  it("is refused, saying why, when it samples EDM noise levels (Playground v2.5's), which no stand-in can", async () => {
    const dir = await withScheduler('edm', 'EDMDPMSolverMultistepScheduler', { sigma_min: 0.002, sigma_max: 80, sigma_data: 0.5, sigma_schedule: 'exponential' });
    const verdict = await inspectModelFolder(dir);
    expect(verdict).toMatchObject({ usable: false, reason: expect.stringMatching(/EDMDPMSolverMultistepScheduler samples EDM noise levels \(sigma_data 0\.5\), not a DDPM beta schedule/) });
  });

  it('on a FLUX model, flow-matching Euler stands in', async () => {
    const dir = await installedCopy('flux-schnell', 'heun');
    const file = path.join(dir, 'scheduler', 'scheduler_config.json');
    await writeFile(file, JSON.stringify({ ...JSON.parse(await readFile(file, 'utf8')), _class_name: 'FlowMatchHeunDiscreteScheduler' }));
    const verdict = await inspectModelFolder(dir);
    if (!verdict.usable) throw new Error(verdict.reason);
    expect(verdict.layout.schedulerStandIn).toEqual({ named: 'FlowMatchHeunDiscreteScheduler', by: 'flow_match_euler' });
  });

  it("on a FLUX model, flow-matching Euler stands in for DPM-Solver on flow sigmas; a class of the other kind of model is refused, saying what to name", async () => {
    // As diffusers saves DPM-Solver switched in for FLUX dev (FluxPipeline runs it on its flow sigmas, shifted by mu).
    const dpm = await withScheduler('flux-dpm', 'DPMSolverMultistepScheduler', { use_flow_sigmas: true, prediction_type: 'flow_prediction', flow_shift: 3 }, 'flux-dev');
    const verdict = await inspectModelFolder(dpm);
    if (!verdict.usable) throw new Error(verdict.reason);
    expect(verdict.layout.schedulerStandIn).toEqual({ named: 'DPMSolverMultistepScheduler', by: 'flow_match_euler', why: 'use_flow_sigmas' });
    expect(verdict.layout.scheduler).toMatchObject({ _class_name: 'FlowMatchEulerDiscreteScheduler', use_dynamic_shifting: true });
    // Euler's noise-prediction sigmas on a flow transformer, flow matching on a UNet: each drew noise.
    const euler = await withScheduler('flux-euler', 'EulerDiscreteScheduler', {}, 'flux-schnell');
    expect(reasonOf(await inspectModelFolder(euler))).toMatch(
      /scheduler_config\.json: EulerDiscreteScheduler schedules noise-prediction \(Stable Diffusion\) models, and this model is a flow-matching \(FLUX\) one: give it its base model's scheduler_config\.json, whose _class_name is FlowMatchEulerDiscreteScheduler$/,
    );
    const flow = await withScheduler('sd-flow', 'FlowMatchEulerDiscreteScheduler');
    expect(reasonOf(await inspectModelFolder(flow))).toMatch(/FlowMatchEulerDiscreteScheduler schedules flow-matching \(FLUX\) models, .*whose _class_name is one of PNDMScheduler, DDIMScheduler, EulerDiscreteScheduler/);
  });
});
