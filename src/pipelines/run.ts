import { encodeImage, CONTENT_TYPES } from '../engine/encode-image.js';
import { defaultRuntime, type RuntimeOptions } from '../engine/providers.js';
import type { GeneratedImage, GenerationBatch } from '../engine/types.js';
import { loadPipeline } from './load.js';
import type { GenerateHooks, Pipeline, RgbImage } from './pipeline.js';

/**
 * The engine's entry point inside a worker: keeps pipelines loaded between batches, splits a batch into
 * chunks that fit the memory bound, and encodes the pictures.
 */

export interface EngineSettings {
  runtime: RuntimeOptions;
  /** Pipelines kept loaded in this worker; the least recently used goes first. */
  maxLoadedModels: number;
  /** Images x pixels denoised in one model call. */
  maxBatchPixels: number;
}

let settings: EngineSettings = { runtime: defaultRuntime(), maxLoadedModels: 2, maxBatchPixels: 4 * 1024 * 1024 };
const loaded = new Map<string, Promise<Pipeline>>();

export function configureEngine(update: Partial<EngineSettings>): void {
  settings = { ...settings, ...update };
}

/** The pipeline for a model folder, loading it on first use and unloading the least recently used. */
export async function getPipeline(modelDir: string): Promise<Pipeline> {
  let pipeline = loaded.get(modelDir);
  if (pipeline) {
    loaded.delete(modelDir); // re-insert: Map order is our recency order
  } else {
    pipeline = loadPipeline(modelDir, settings.runtime);
    pipeline.catch(() => loaded.delete(modelDir));
  }
  loaded.set(modelDir, pipeline);
  while (loaded.size > settings.maxLoadedModels) {
    const [oldest, evicted] = loaded.entries().next().value!;
    loaded.delete(oldest);
    evicted.then((p) => p.release()).catch(() => undefined);
  }
  return pipeline;
}

export async function generateImages(batch: GenerationBatch, hooks: GenerateHooks = {}): Promise<RgbImage[]> {
  const pipeline = await getPipeline(batch.modelDir);
  const m = pipeline.sizeMultiple;
  if (batch.width % m || batch.height % m || batch.width <= 0 || batch.height <= 0) {
    throw new RangeError(`${batch.width}x${batch.height} is not a valid size for this model: both sides must be positive multiples of ${m}`);
  }
  const chunk = Math.max(1, Math.floor(settings.maxBatchPixels / (batch.width * batch.height)));
  const images: RgbImage[] = [];
  const totalSteps = Math.ceil(batch.items.length / chunk);
  for (let start = 0, part = 0; start < batch.items.length; start += chunk, part++) {
    const items = batch.items.slice(start, start + chunk);
    const onStep = hooks.onStep && ((step: number, total: number) => hooks.onStep!(part * total + step, totalSteps * total));
    images.push(...(await pipeline.generate({ ...batch, items }, { ...hooks, onStep })));
  }
  return images;
}

export async function runBatch(batch: GenerationBatch, hooks?: GenerateHooks): Promise<GeneratedImage[]> {
  const images = await generateImages(batch, hooks);
  return Promise.all(
    images.map(async (image, i) => ({
      data: await encodeImage(image, batch.outputFormat, batch.outputCompression),
      contentType: CONTENT_TYPES[batch.outputFormat],
      seed: batch.items[i].seed,
    })),
  );
}
