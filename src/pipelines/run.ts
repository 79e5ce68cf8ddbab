import os from 'node:os';
import path from 'node:path';
import { componentFile } from '../runtime/component-file.js';
import { GpuFaultError } from '../runtime/gpu-faults.js';
import { OnnxOutOfMemoryError } from '../runtime/onnx-model.js';
import { defaultRuntime, providerInUse, type RuntimeOptions } from '../runtime/providers.js';
import { everyItemMade, IMAGE_FORMATS, outputOf, previewSteps, type BatchEvent, type BatchItem, type GeneratedImage, type GenerationBatch } from '../runtime/types.js';
import { chunks } from '../util/chunks.js';
import { firstLineOf } from '../util/error-message.js';
import { encodeImage } from './encode-image.js';
import { loadPipeline } from './load.js';
import { nativeSide } from '../models/presets.js';
import type { ModelMemory } from '../models/memory-figures.js';
import { InsufficientMemoryError, localMemory, MemoryPlan, type MemorySource, type VaeTilingMode } from './memory-plan.js';
import { GenerationCancelled, type GenerateHooks, type Pipeline, type RgbImage } from './pipeline.js';
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
  /** What models measured in earlier workers (by model folder), so the first batch here is planned too; a worker's pool sends what is measured later (adoptMemory). */
  knownMemory: Record<string, ModelMemory>;
  /** Most memory one batch may plan to take on top of the loaded models (undefined: what is free); for a runtime without a memory source of its own. */
  memoryLimit?: number;
  /** When the VAE decodes in tiles (see VaeTilingMode); default 'auto'. */
  vaeTiling?: VaeTilingMode;
}

/** What the owner of a runtime in its own process (the CLI) hears of its work beyond the batches it runs. */
export interface RuntimeEvents {
  /** A model that never ran on this machine is about to be calibrated (see WorkerRuntime.calibrate): seconds, or a minute for an SDXL on a CPU. */
  calibrating?(modelDir: string): void;
  /** Its calibration ended: modelMemory has what it measured, to keep for the next process. */
  calibrated?(modelDir: string): void;
}

/**
 * Sides of the calibration runs (see WorkerRuntime.calibrate), as shares of the model's native side:
 * small enough to cost little, two to fit a curve, near enough to the native size that the curve holds
 * there (`npm run bench:memory-plan` shows how well).
 */
const CALIBRATION_SHARES = [1 / 2, 3 / 4];

/** Images x pixels denoised in one model call at most: a batch with more runs in parts. */
const MAX_BATCH_PIXELS = 4 * 1024 * 1024;

/**
 * The share of the memory that holds the loaded models' weights (RAM, or on CUDA the GPU's) that they
 * may take when MODEL_MEMORY_BUDGET is not set: the rest is for the batches' activations and arenas.
 */
export const MODEL_BUDGET_SHARE = 0.6;

const defaults = (): EngineSettings => ({
  runtime: defaultRuntime(),
  modelMemoryBudget: Math.floor(os.totalmem() * MODEL_BUDGET_SHARE),
  knownMemory: {},
});

export class WorkerRuntime {
  private readonly settings: EngineSettings;
  private readonly memory: MemoryPlan;
  private readonly pipelines: PipelineCache;
  /**
   * Loads (the model's folder for the model, a component's file for one loaded on demand in a run: the
   * model that loads alone may still fail to load its VAE encoder beside it) that ran out of memory
   * while this runtime held no other model (see withRoom), with the model's version. Releasing the other
   * models cannot help them, so a request for one no longer costs the models held beside it (reloaded by
   * the next request for each: with a client retrying, on every request). A model's note goes once it
   * loads after all (memory that others held, another process or a GPU's other users, was freed); a
   * component's stays for the runtime's life, a worker's. A folder replaced in place is a new version.
   */
  private readonly failedAlone = new Map<string, string | undefined>();

  /** `memory`: who grants batches their memory (a worker's pool); by default what this process sees free. `events`: see RuntimeEvents. */
  constructor(
    settings: Partial<EngineSettings> = {},
    memory?: MemorySource,
    private readonly events: RuntimeEvents = {},
  ) {
    this.settings = { ...defaults(), ...settings };
    this.memory = new MemoryPlan(this.settings.knownMemory, memory ?? localMemory(this.settings.memoryLimit), this.settings.vaeTiling);
    const runtime = this.settings.runtime;
    this.pipelines = new PipelineCache(async (dir, version) => {
      // Measured anew if it loads again after others were released: their memory is not its own.
      const load = () => this.memory.measureLoad(dir, version, () => loadPipeline(dir, runtime, this.memory));
      const pipeline = await this.withRoom(dir, version, load, () => dir).catch((err: unknown) => {
        throw err instanceof OnnxOutOfMemoryError ? ranOutOfMemory(path.basename(dir), err, undefined, this.failsAlone(dir, version)) : err;
      });
      // Loaded after all (what held the memory let go): its failure alone no longer says what it needs.
      this.failedAlone.delete(dir);
      await this.calibrate(pipeline);
      return pipeline;
    }, this.settings.modelMemoryBudget);
  }

  /**
   * A model that never ran on this machine first runs one step at half and three quarters of its native
   * side: its memory plan then extrapolates from measured figures (models/memory-curve.ts) instead of
   * knowing nothing, and a first request too large for the machine gets 507 rather than the OOM killer. The figures are kept in
   * DATA_DIR, so this happens once per model and machine. The runs use guidance, as most requests do;
   * their figures count per sample (Pipeline.samplesPerImage), so they serve requests without it too.
   */
  private async calibrate(pipeline: Pipeline): Promise<void> {
    const { dir, sizeMultiple } = pipeline.layout;
    if (!this.memory.measuresPhases || this.memory.of(dir)?.denoise) return;
    const run = async () => {
      for (const share of CALIBRATION_SHARES) {
        const size = Math.ceil((nativeSide(pipeline.layout) * share) / sizeMultiple) * sizeMultiple;
        const batch: GenerationBatch = { modelDir: dir, width: size, height: size, steps: 1, guidanceScale: 2, items: [{ prompt: '', seed: 0 }] };
        // A model that cannot run a plain generation is measured on its first batch instead, whose error
        // then says why; but a GPU fault ends the process's use of the GPU (GpuFaultError), whatever runs next.
        const measured = await this.memory.measureRun(dir, pipeline.samplesPerImage(batch), size * size, () => pipeline.generate(batch, {})).then(
          () => true,
          (err: unknown) => {
            if (err instanceof GpuFaultError) throw err;
            return false;
          },
        );
        if (!measured) return;
      }
    };
    this.events.calibrating?.(dir);
    // What the runs will take is what they are to find out: they wait for other workers' batches to
    // take what they planned on, and those planned meanwhile wait for them. Only a worker that stops
    // ends the wait (GenerationCancelled); it exits with the model loaded and not calibrated.
    await this.memory
      .exclusive(run)
      .catch((err: unknown) => {
        if (!(err instanceof GenerationCancelled)) throw err;
      })
      .finally(() => this.events.calibrated?.(dir));
  }

  /**
   * Runs `attempt`, which loads a model (or one of its components, on demand, in a run); when onnxruntime
   * runs out of memory loading it while this runtime holds other models that no run uses, releases them
   * and runs `attempt` once more. The budget (MODEL_MEMORY_BUDGET) releases models only by their weights'
   * bytes and after a load; a limit it cannot see (a GPU's memory, a container's) makes a load fail first.
   * Here rather than in PipelineCache: the retry has to be measured on its own (MemoryPlan.measureLoad, or
   * measureRun for a component loaded on demand, which the cache never sees load), and it is the out-of-
   * memory error that decides, which this module turns into the client's 507. The cache says which models
   * are idle (PipelineCache.releaseIdle): never the one loading, nor one a run uses. In a worker, which
   * loads its preloads one by one before it is ready, then runs one task at a time (worker.ts's perform,
   * which the pool sends only to a ready, idle worker) and calibrates a model inside its own load, the
   * one model in use as another loads is the one whose component loads on demand; a runtime in one
   * process (the CLI, tests) may run several batches at once, which use() counts. `loading`: what
   * failedAlone notes the failed load as (the model's folder, or the component's file).
   */
  private async withRoom<T>(modelDir: string, version: string | undefined, attempt: () => Promise<T>, loading: (err: OnnxOutOfMemoryError) => string): Promise<T> {
    try {
      return await attempt();
    } catch (err) {
      if (!loadRanOutOfMemory(err) || this.failsAlone(loading(err), version)) throw err;
      const released = await this.pipelines.releaseIdle(modelDir);
      if (released.length === 0) throw this.noteAlone(modelDir, loading(err), version, err);
      const names = released.map((dir) => `'${path.basename(dir)}'`).join(', ');
      (this.settings.runtime.warn ?? console.warn)(
        `Model '${path.basename(modelDir)}' ran out of memory loading ${componentFile(err.file)}; released the idle model(s) ${names} to make room for it, and loading it once more.`,
      );
      return await attempt().catch((again: unknown) => {
        throw loadRanOutOfMemory(again) ? this.noteAlone(modelDir, loading(again), version, again) : again;
      });
    }
  }

  /** `err`, once `loading` is noted in failedAlone when this runtime holds no model but `modelDir` (a load fails with nothing else to release). */
  private noteAlone(modelDir: string, loading: string, version: string | undefined, err: unknown): unknown {
    if (this.pipelines.loadedModels().every((dir) => dir === modelDir)) this.failedAlone.set(loading, version);
    return err;
  }

  /** Whether this version's `loading` (see failedAlone) failed with no other model held. */
  private failsAlone(loading: string, version: string | undefined): boolean {
    return this.failedAlone.has(loading) && this.failedAlone.get(loading) === version;
  }

  /**
   * What a model folder has cost here, once loaded (and once it ran), for DATA_DIR's figures of the
   * configured provider: none where its sessions run on the CPU because the GPU provider did not start.
   * Those are the CPU's figures, which kept as the GPU's (that the GPU's runs planned from once it
   * started, the model never calibrated again) counted its activations in host memory.
   */
  modelMemory(modelDir: string): ModelMemory | undefined {
    const { runtime } = this.settings;
    if (providerInUse(runtime) !== runtime.provider) return undefined;
    return this.memory.of(modelDir);
  }

  /** Plans with a model's figures as the pool keeps them, all workers' together (see MemoryPlan.adopt). */
  adoptMemory(modelDir: string, pooled: ModelMemory): void {
    this.memory.adopt(modelDir, pooled);
  }

  /** The model folders this runtime holds (or is loading), least recently used first. */
  heldModels(): string[] {
    return this.pipelines.loadedModels();
  }

  /** Whether this runtime holds (or is loading) this version of a model folder. */
  holdsModel(modelDir: string, version?: string): boolean {
    return this.pipelines.holds(modelDir, version);
  }

  /** Releases a model folder's sessions (now, or as the run using them ends); the next use loads it again. */
  releaseModel(modelDir: string): Promise<void> {
    return this.pipelines.release(modelDir);
  }

  /** The pipeline for a model folder, loaded on first use and kept while the memory budget allows. */
  getPipeline(modelDir: string, version?: string): Promise<Pipeline> {
    return this.pipelines.get(modelDir, version);
  }

  /**
   * The batch's pictures, in item order; `hooks` hear of its parts' steps as of one loop over all its
   * items. No previews: a part's loop numbers its items within the part (runBatch maps them back).
   */
  async generateImages(batch: GenerationBatch, hooks: Pick<GenerateHooks, 'onStep' | 'shouldStop'> = {}): Promise<RgbImage[]> {
    return everyItemMade(await this.runInParts(batch, nobodyLeft, (part) => ({ ...hooks, onStep: hooks.onStep && part.step(hooks.onStep) })));
  }

  /**
   * The batch's images, encoded as each item asks, and its events: progress after every step, and the
   * previews its items asked for (BatchItem.partialImages), encoded like their images.
   */
  async runBatch(batch: GenerationBatch, hooks: BatchHooks = {}): Promise<GeneratedImage[]> {
    return everyItemMade(await this.runMerged(batch, nobodyLeft, hooks));
  }

  /**
   * As runBatch, for a batch that clients may leave while it runs, others staying (a merged batch: see
   * engine/batcher.ts): `left` says whose items, asked as the work goes on. Such an item gets no image
   * (undefined), and from then on no preview, decoding (seconds on a CPU) or encoding; a part of the
   * batch (see runPartsWith) all of whose items left does not run, or stops at its next step, so the
   * items that stay are done sooner. Its rows in a part that runs on are denoised with the others': the
   * loop's latents, conditioning and scheduler state are the part's, and would all have to be cut apart.
   */
  async runMerged(batch: GenerationBatch, left: (item: number) => boolean, { shouldStop, onEvent }: BatchHooks = {}): Promise<(GeneratedImage | undefined)[]> {
    const wanted = batch.items.map((item) => (onEvent && item.partialImages) || 0);
    const sent = wanted.map(() => 0);
    const wants = (item: number, step: number, total: number) => !left(item) && previewSteps(wanted[item], total).includes(step);
    const images = await this.runInParts(batch, left, (part) => ({
      shouldStop,
      onStep: onEvent && part.step((step, total) => onEvent({ type: 'step', step, total })),
      // Numbered within the part, as its loop sees them.
      previewsAt: (step, total) => part.items.flatMap((item, i) => (wants(item, step, total) ? [i] : [])),
      onPreview:
        onEvent &&
        (async (previews) => {
          for (const { item: i, image } of previews) {
            const item = part.items[i];
            onEvent({ type: 'preview', item, index: sent[item]++, image: await encode(image, batch.items[item]) });
          }
        }),
    }));
    return Promise.all(images.map((image, i) => (image && !left(i) ? encode(image, batch.items[i]) : undefined)));
  }

  /**
   * Runs the batch in parts that fit the memory plan, one after the other, each with the hooks
   * `hooksFor` gives it (see Part), without the items `left` names (see runMerged).
   */
  private runInParts(batch: GenerationBatch, left: (item: number) => boolean, hooksFor: (part: Part) => GenerateHooks): Promise<(RgbImage | undefined)[]> {
    // In use while it runs: a load that runs out of memory meanwhile (another run's, in this process) leaves it be.
    return this.pipelines.use(batch.modelDir, batch.modelVersion, (pipeline) => this.runPartsWith(pipeline, batch, left, hooksFor));
  }

  private async runPartsWith(pipeline: Pipeline, batch: GenerationBatch, left: (item: number) => boolean, hooksFor: (part: Part) => GenerateHooks): Promise<(RgbImage | undefined)[]> {
    const m = pipeline.layout.sizeMultiple;
    if (batch.width % m || batch.height % m || batch.width <= 0 || batch.height <= 0) {
      throw new RangeError(`${batch.width}x${batch.height} is not a valid size for this model: both sides must be positive multiples of ${m}`);
    }
    const byPixels = Math.max(1, Math.floor(MAX_BATCH_PIXELS / (batch.width * batch.height)));
    // The memory plan holds what the largest part takes: parts no larger than MAX_BATCH_PIXELS allows.
    const samples = pipeline.samplesPerImage(batch);
    const perRun = await this.memory.imagesPerRun(pipeline.layout, { ...batch, items: batch.items.slice(0, byPixels) }, path.basename(batch.modelDir), samples);
    const parts = chunks(batch.items, perRun);
    const images: (RgbImage | undefined)[] = [];
    // The denoiser passes of a part's loop, once one told them (every part's are the batch's).
    let passes: number | undefined;
    for (const [index, items] of parts.entries()) {
      const numbers = items.map((_, i) => images.length + i);
      const kept = numbers.filter((item) => !left(item));
      const part: Part = {
        items: kept,
        step: (onStep) => (step, total) => {
          passes = total;
          onStep(index * total + step, parts.length * total);
        },
      };
      const hooks = hooksFor(part);
      const abandoned = () => kept.every((item) => left(item));
      const run = () =>
        pipeline.generate(
          { ...batch, items: kept.map((item) => batch.items[item]) },
          { ...hooks, shouldStop: () => hooks.shouldStop?.() === true || abandoned(), wanted: (i) => !left(kept[i]) },
        );
      // A component loaded on demand (the VAE encoder) loads before the part's first step: run again after
      // making room for it, the part has told its hooks nothing yet.
      const measured = () => this.memory.measureRun(batch.modelDir, kept.length * samples, batch.width * batch.height, run);
      const made = abandoned()
        ? undefined
        : await this.withRoom(batch.modelDir, batch.modelVersion, measured, (err) => err.file).catch(async (err: unknown) => {
            if (err instanceof GenerationCancelled && abandoned() && hooks.shouldStop?.() !== true) return undefined;
            if (!(err instanceof OnnxOutOfMemoryError)) throw err;
            // A component loaded on demand (the VAE encoder) failing to load taught nothing about the size.
            if (err.during === 'run') {
              this.memory.recordExceeded(batch.modelDir, kept.length * samples, batch.width * batch.height);
              // The failed run's arenas keep what it got, which other sessions (the arena-less VAE) cannot
              // use: the model's sessions go, and the next batch loads them again with the memory back.
              await this.pipelines.release(batch.modelDir);
            }
            throw ranOutOfMemory(path.basename(batch.modelDir), err, { batch, images: kept.length }, err.during === 'load' && this.failsAlone(err.file, batch.modelVersion));
          });
      // A part given up counts as done, so that the batch's progress still ends at its total.
      if (!made && passes !== undefined) hooks.onStep?.(passes, passes);
      images.push(...numbers.map((item) => (made && kept.includes(item) ? made[kept.indexOf(item)] : undefined)));
    }
    return images;
  }
}

/** One of the parts a batch runs in. */
interface Part {
  /** The batch's item number of each of the part's items. */
  items: number[];
  /** A step callback over the whole batch, for the part's own steps: the parts' loops count as one. */
  step(onStep: (step: number, total: number) => void): (step: number, total: number) => void;
}

/** No item's client left: a batch run by one client (see WorkerRuntime.runMerged). */
const nobodyLeft = (): boolean => false;

/** What runBatch's caller hears: whether to stop, and the batch's events. */
export interface BatchHooks {
  shouldStop?(): boolean;
  onEvent?(event: BatchEvent): void;
}

const loadRanOutOfMemory = (err: unknown): err is OnnxOutOfMemoryError => err instanceof OnnxOutOfMemoryError && err.during === 'load';

/**
 * onnxruntime could not allocate what a model needed, though the plan expected it to fit (another process
 * took the memory, a limit the plan cannot see such as a container's or the GPU's): a 507 like the
 * plan's own. `making`: the images of the run, when it failed running rather than loading. `alone`: it
 * failed to load with no other model held (see WorkerRuntime.withRoom), which a lower
 * MODEL_MEMORY_BUDGET cannot help.
 */
function ranOutOfMemory(modelName: string, err: OnnxOutOfMemoryError, making?: { batch: GenerationBatch; images: number }, alone = false): InsufficientMemoryError {
  const component = path.basename(path.dirname(err.file));
  const cause = `(onnxruntime: ${firstLineOf(err.detail)})`;
  const freeMemory = `fewer WORKERS (each holds its own models), ${alone ? '' : 'a lower MODEL_MEMORY_BUDGET, '}or on CUDA a GPU with more memory`;
  if (err.during === 'load' || !making) {
    return new InsufficientMemoryError(
      `Model '${modelName}' ran out of memory loading ${componentFile(err.file)} ${cause}: its weights need more memory than this worker could get${alone ? ', even holding no other model' : ''}.` +
        ` Free memory for it: ${freeMemory}; or install a smaller export of it (fp16).`,
    );
  }
  const { batch, images } = making;
  return new InsufficientMemoryError(
    `Model '${modelName}' ran out of memory making ${images} image(s) of ${batch.width}x${batch.height} ${cause}.` +
      ` Ask for a smaller size or fewer images${component === 'vae_decoder' ? ', set VAE_TILING=always' : ''}, or free memory: ${freeMemory}.`,
  );
}

/** An item's picture as the file it asked for. */
async function encode(image: RgbImage, item: BatchItem): Promise<GeneratedImage> {
  const { format, compression } = outputOf(item);
  return { data: await encodeImage(image, format, compression), contentType: IMAGE_FORMATS[format].contentType, seed: item.seed };
}
