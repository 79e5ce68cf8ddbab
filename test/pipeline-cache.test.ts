import { readdir, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { inspectModel, MISSING_FOLDER } from '../src/models/layout.js';
import { loadPipeline } from '../src/pipelines/load.js';
import type { Pipeline } from '../src/pipelines/pipeline.js';
import { PipelineCache, weightBytes } from '../src/pipelines/pipeline-cache.js';
import { copyOfReference, referenceModel } from './helpers/reference.js';

/** Real pipelines, loaded through a loader that counts how often each model was loaded. */
function cache(budget: number) {
  const loads: string[] = [];
  const c = new PipelineCache((dir) => {
    loads.push(dir);
    return loadPipeline(dir, { provider: 'cpu', threads: 1 });
  }, budget);
  return { cache: c, loads };
}

/** 'released' once the pipeline's sessions are gone. */
function tryGenerate(pipeline: Pipeline): Promise<string> {
  const batch = { modelDir: pipeline.layout.dir, width: 64, height: 64, steps: 1, guidanceScale: 0, items: [{ prompt: 'x', negativePrompt: '', seed: 1 }] };
  return pipeline.generate(batch).then(
    () => 'ran',
    () => 'released',
  );
}

describe('loaded models within a memory budget', () => {
  const [a, b] = [referenceModel('sd-turbo'), referenceModel('sd15-optimum')];

  it('keeps models loaded between uses while they fit', async () => {
    const { cache: c, loads } = cache(Number.MAX_SAFE_INTEGER);
    await c.get(a);
    await c.get(b);
    await c.get(a);
    expect(loads).toEqual([a, b]);
    expect(c.loadedModels()).toEqual([b, a]);
  });

  it('counts every graph folder, the VAE encoder too before it loads at the first edit', async () => {
    const layout = await inspectModel(b);
    if (!layout.vaeEncoder) throw new Error(`${b} should have a VAE encoder`);
    let folders = 0;
    for (const folder of ['text_encoder', 'unet', 'vae_decoder', 'vae_encoder']) {
      for (const name of await readdir(path.join(b, folder))) folders += (await stat(path.join(b, folder, name))).size;
    }
    expect(await weightBytes(layout)).toBe(folders);
  });

  it('releases the least recently used model once the budget is passed', async () => {
    const oneModel = await weightBytes(await inspectModel(a));
    const { cache: c, loads } = cache(oneModel * 1.5);
    const first = await c.get(a);
    await c.get(b);
    expect(c.loadedModels()).toEqual([b]);
    // Released, not just forgotten: its sessions are gone.
    await expect.poll(() => tryGenerate(first)).toBe('released');
    await c.get(a);
    expect(loads).toEqual([a, b, a]);
    expect(c.loadedModels()).toEqual([a]);
  });

  it('reloads a model whose folder was replaced in place, releasing the old sessions', async () => {
    const { cache: c, loads } = cache(Number.MAX_SAFE_INTEGER);
    const old = await c.get(a, 'v1');
    await c.get(a, 'v1');
    await c.get(a, 'v2');
    expect(loads).toEqual([a, a]);
    expect(c.holds(a, 'v2')).toBe(true);
    await expect.poll(() => tryGenerate(old)).toBe('released');
  });

  it('keeps the sessions runs use when their model is released or replaced, releasing them as the last such run ends', async () => {
    const { cache: c, loads } = cache(Number.MAX_SAFE_INTEGER);
    // Released (as a run that ran out of memory releases its model's) while two runs use it.
    const released = await c.use(a, 'v1', async (inUse) => {
      await c.use(a, 'v1', async () => {
        await c.release(a);
        expect(await tryGenerate(inUse)).toBe('ran');
      });
      expect(await tryGenerate(inUse)).toBe('ran');
      return inUse;
    });
    expect(await tryGenerate(released)).toBe('released');
    // Its folder replaced in place while a run uses it.
    const replaced = await c.use(a, 'v1', async (inUse) => {
      expect(await tryGenerate(await c.get(a, 'v2'))).toBe('ran');
      expect(await tryGenerate(inUse)).toBe('ran');
      return inUse;
    });
    expect(await tryGenerate(replaced)).toBe('released');
    expect(loads).toEqual([a, a, a]);
    expect(c.holds(a, 'v2')).toBe(true);
  });

  it('keeps the version that replaced one still loading when that load fails after all', async () => {
    // Version v1 loads from a folder cut short (as a folder replaced under its load reads), v2 from the model.
    const damaged = await copyOfReference('sd-turbo');
    await writeFile(path.join(damaged, 'unet', 'model.onnx'), 'not an onnx file');
    const loads: string[] = [];
    const c = new PipelineCache((dir, version) => {
      loads.push(`${version}`);
      return loadPipeline(version === 'v1' ? damaged : dir, { provider: 'cpu', threads: 1 });
    }, Number.MAX_SAFE_INTEGER);
    const replaced = c.get(a, 'v1');
    const current = c.get(a, 'v2');
    await expect(replaced).rejects.toThrow(/unet/);
    expect(await tryGenerate(await current)).toBe('ran');
    // Before, v1's failure took v2 out of the cache: its sessions held and uncounted, and loaded once more.
    expect(c.holds(a, 'v2')).toBe(true);
    await c.get(a, 'v2');
    expect(loads).toEqual(['v1', 'v2']);
  });

  it('fails the load of a model removed as its load ends as removed, its sessions released and nothing kept', async () => {
    const removed = await copyOfReference('sd-turbo');
    let loaded: Pipeline | undefined;
    // `models remove` once the sessions are made, before the cache counts the model's weight files.
    const c = new PipelineCache(async (dir) => {
      loaded = await loadPipeline(dir, { provider: 'cpu', threads: 1 });
      await rm(dir, { recursive: true });
      return loaded;
    }, Number.MAX_SAFE_INTEGER);
    // Before, the count's bare ENOENT (a 500 to the client) failed it, and the entry stayed with its sessions held for good.
    await expect(c.get(removed, 'v1')).rejects.toMatchObject({ name: 'ModelLayoutError', problem: MISSING_FOLDER });
    expect(await tryGenerate(loaded!)).toBe('released');
    expect(c.loadedModels()).toEqual([]);
  });

  it('never releases a model that a run uses, over the budget or to make room', async () => {
    const oneModel = await weightBytes(await inspectModel(a));
    const { cache: c } = cache(oneModel * 1.5);
    await c.use(a, undefined, async (inUse) => {
      await c.get(b);
      expect(c.loadedModels()).toEqual([a, b]);
      // Making room for a third model: 'b' is idle, 'a' in use.
      expect(await c.releaseIdle('elsewhere')).toEqual([b]);
      expect(await tryGenerate(inUse)).toBe('ran');
    });
    expect(c.loadedModels()).toEqual([a]);
  });

  it('makes room with the loaded models only: not the one kept, nor one still loading', async () => {
    const { cache: c } = cache(Number.MAX_SAFE_INTEGER);
    const idle = await c.get(a);
    const loading = c.get(b);
    expect(await c.releaseIdle(a)).toEqual([]);
    expect(await c.releaseIdle('elsewhere')).toEqual([a]);
    await expect.poll(() => tryGenerate(idle)).toBe('released');
    expect(await tryGenerate(await loading)).toBe('ran');
    expect(c.loadedModels()).toEqual([b]);
  });

  it('still runs a model larger than the whole budget', async () => {
    const { cache: c } = cache(1);
    const pipeline = await c.get(a);
    expect(pipeline.layout.dir).toBe(a);
    expect(c.loadedModels()).toEqual([a]);
  });
});
