import { encodeImage } from '../engine/encode-image.js';
import { defaultRuntime, type RuntimeOptions } from '../engine/providers.js';
import { IMAGE_FORMATS, type GeneratedImage, type GenerationBatch } from '../engine/types.js';
import os from 'node:os';
import { SIZE_MULTIPLE } from '../models/layout.js';
import { chunks } from '../util/chunks.js';
import { loadPipeline } from './load.js';
import type { GenerateHooks, Pipeline, RgbImage } from './pipeline.js';
import { PipelineCache } from './pipeline-cache.js';

/**
 * The engine's entry point inside a worker: keeps pipelines loaded between batches, splits a batch into
 * chunks that fit the memory bound, and encodes the pictures.
 */

export interface EngineSettings {
  runtime: RuntimeOptions;
  /** Bytes of model weights this worker keeps loaded; beyond it the least recently used model goes. */
  modelMemoryBudget: number;
  /** Images x pixels denoised in one model call. */
  maxBatchPixels: number;
}

let settings: EngineSettings = {
  runtime: defaultRuntime(),
  modelMemoryBudget: Math.floor(os.totalmem() * 0.6),
  maxBatchPixels: 4 * 1024 * 1024,
};
const pipelines = new PipelineCache((dir) => loadPipeline(dir, settings.runtime), settings.modelMemoryBudget);

export function configureEngine(update: Partial<EngineSettings>): void {
  settings = { ...settings, ...update };
  pipelines.setBudget(settings.modelMemoryBudget);
}

/** Whether this worker holds (or is loading) this version of a model folder. */
export function holdsModel(modelDir: string, version?: string): boolean {
  return pipelines.holds(modelDir, version);
}

/** The pipeline for a model folder, loaded on first use and kept while the memory budget allows. */
export function getPipeline(modelDir: string, version?: string): Promise<Pipeline> {
  return pipelines.get(modelDir, version);
}

export async function generateImages(batch: GenerationBatch, hooks: GenerateHooks = {}): Promise<RgbImage[]> {
  const pipeline = await getPipeline(batch.modelDir, batch.modelVersion);
  const m = SIZE_MULTIPLE[pipeline.layout.family];
  if (batch.width % m || batch.height % m || batch.width <= 0 || batch.height <= 0) {
    throw new RangeError(`${batch.width}x${batch.height} is not a valid size for this model: both sides must be positive multiples of ${m}`);
  }
  const parts = chunks(batch.items, Math.max(1, Math.floor(settings.maxBatchPixels / (batch.width * batch.height))));
  const images: RgbImage[] = [];
  for (const [part, items] of parts.entries()) {
    const onStep = hooks.onStep && ((step: number, total: number) => hooks.onStep!(part * total + step, parts.length * total));
    images.push(...(await pipeline.generate({ ...batch, items }, { ...hooks, onStep })));
  }
  return images;
}

export async function runBatch(batch: GenerationBatch, hooks?: GenerateHooks): Promise<GeneratedImage[]> {
  const images = await generateImages(batch, hooks);
  return Promise.all(
    images.map(async (image, i) => ({
      data: await encodeImage(image, batch.outputFormat, batch.outputCompression),
      contentType: IMAGE_FORMATS[batch.outputFormat].contentType,
      seed: batch.items[i].seed,
    })),
  );
}
