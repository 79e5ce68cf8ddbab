import { describe, expect, it } from 'vitest';
import { inspectModel } from '../src/models/layout.js';
import { loadPipeline } from '../src/pipelines/load.js';
import { PipelineCache, weightBytes } from '../src/pipelines/pipeline-cache.js';
import { referenceModel } from './helpers/reference.js';

/** Real pipelines, loaded through a loader that counts how often each model was loaded. */
function cache(budget: number) {
  const loads: string[] = [];
  const c = new PipelineCache((dir) => {
    loads.push(dir);
    return loadPipeline(dir, { provider: 'cpu', threads: 1 });
  }, budget);
  return { cache: c, loads };
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

  it('releases the least recently used model once the budget is passed', async () => {
    const oneModel = await weightBytes(await inspectModel(a));
    const { cache: c, loads } = cache(oneModel * 1.5);
    const first = await c.get(a);
    await c.get(b);
    expect(c.loadedModels()).toEqual([b]);
    // Released, not just forgotten: its sessions are gone.
    await expect.poll(() => first.generate({ modelDir: a, width: 64, height: 64, steps: 1, guidanceScale: 0, outputFormat: 'png', items: [{ prompt: 'x', negativePrompt: '', seed: 1 }] }).then(() => 'ran', () => 'released')).toBe('released');
    await c.get(a);
    expect(loads).toEqual([a, b, a]);
    expect(c.loadedModels()).toEqual([a]);
  });

  it('still runs a model larger than the whole budget', async () => {
    const { cache: c } = cache(1);
    const pipeline = await c.get(a);
    expect(pipeline.layout.dir).toBe(a);
    expect(c.loadedModels()).toEqual([a]);
  });
});
