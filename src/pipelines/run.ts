import os from 'node:os';
import path from 'node:path';
import { defaultRuntime, type RuntimeOptions } from '../runtime/providers.js';
import { IMAGE_FORMATS, outputOf, type GeneratedImage, type GenerationBatch } from '../runtime/types.js';
import { chunks } from '../util/chunks.js';
import { encodeImage } from './encode-image.js';
import { loadPipeline } from './load.js';
import { MemoryPlan, type ModelMemory } from './memory-plan.js';
import type { GenerateHooks, Pipeline, RgbImage } from './pipeline.js';
import { PipelineCache } from './pipeline-cache.js';

/**
 * The engine's entry point inside a worker (and in the CLI's own process): keeps pipelines loaded
 * between batches, splits a batch into parts that fit the memory plan, and encodes the pictures. One
 * object holds all of it, built from its settings, so that two runtimes in one process (tests) never
 * share a cache or a plan.
 */

export interface EngineSettings {
  runtime: RuntimeOptions;
  /** Bytes of model weights this worker keeps loaded; beyond it the least recently used model goes. */
  modelMemoryBudget: number;
  /** Images x pixels denoised in one model call. */
  maxBatchPixels: number;
  /** What models measured in earlier workers (by model folder), so the first batch here is planned too. */
  knownMemory: Record<string, ModelMemory>;
  /** Most memory one batch may plan to take on top of the loaded models (undefined: what is free). */
  memoryLimit?: number;
}

const defaults = (): EngineSettings => ({
  runtime: defaultRuntime(),
  modelMemoryBudget: Math.floor(os.totalmem() * 0.6),
  maxBatchPixels: 4 * 1024 * 1024,
  knownMemory: {},
});

export class WorkerRuntime {
  private readonly settings: EngineSettings;
  private readonly memory: MemoryPlan;
  private readonly pipelines: PipelineCache;

  constructor(settings: Partial<EngineSettings> = {}) {
    this.settings = { ...defaults(), ...settings };
    this.memory = new MemoryPlan(this.settings.knownMemory, this.settings.memoryLimit);
    const runtime = this.settings.runtime;
    this.pipelines = new PipelineCache((dir) => this.memory.measureLoad(dir, () => loadPipeline(dir, runtime)), this.settings.modelMemoryBudget);
  }

  /** What a model folder has cost here, once loaded (and once it ran). */
  modelMemory(modelDir: string): ModelMemory | undefined {
    return this.memory.of(modelDir);
  }

  /** Whether this runtime holds (or is loading) this version of a model folder. */
  holdsModel(modelDir: string, version?: string): boolean {
    return this.pipelines.holds(modelDir, version);
  }

  /** The pipeline for a model folder, loaded on first use and kept while the memory budget allows. */
  getPipeline(modelDir: string, version?: string): Promise<Pipeline> {
    return this.pipelines.get(modelDir, version);
  }

  async generateImages(batch: GenerationBatch, hooks: GenerateHooks = {}): Promise<RgbImage[]> {
    const pipeline = await this.getPipeline(batch.modelDir, batch.modelVersion);
    const m = pipeline.layout.sizeMultiple;
    if (batch.width % m || batch.height % m || batch.width <= 0 || batch.height <= 0) {
      throw new RangeError(`${batch.width}x${batch.height} is not a valid size for this model: both sides must be positive multiples of ${m}`);
    }
    const byPixels = Math.max(1, Math.floor(this.settings.maxBatchPixels / (batch.width * batch.height)));
    const parts = chunks(batch.items, Math.min(byPixels, this.memory.imagesPerRun(pipeline.layout, batch, path.basename(batch.modelDir))));
    const images: RgbImage[] = [];
    for (const [part, items] of parts.entries()) {
      const onStep = hooks.onStep && ((step: number, total: number) => hooks.onStep!(part * total + step, parts.length * total));
      const pixels = items.length * batch.width * batch.height;
      images.push(...(await this.memory.measureRun(batch.modelDir, pixels, () => pipeline.generate({ ...batch, items }, { ...hooks, onStep }))));
    }
    return images;
  }

  async runBatch(batch: GenerationBatch, hooks?: GenerateHooks): Promise<GeneratedImage[]> {
    const images = await this.generateImages(batch, hooks);
    return Promise.all(
      images.map(async (image, i) => {
        const { format, compression } = outputOf(batch.items[i]);
        return { data: await encodeImage(image, format, compression), contentType: IMAGE_FORMATS[format].contentType, seed: batch.items[i].seed };
      }),
    );
  }
}
