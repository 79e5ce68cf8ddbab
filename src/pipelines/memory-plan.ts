import { peakBytes, plannableBytes, resetPeak, residentBytes, settledResidentBytes } from '../runtime/memory.js';
import type { GenerationBatch } from '../runtime/types.js';
import type { ModelLayout } from '../models/layout.js';
import { formatBytes } from '../util/bytes.js';
import { bytesPerImage, leastPerImage } from '../models/memory-curve.js';
import { exceededFigures, figuresFor, mergeMemory, type ModelMemory } from '../models/memory-figures.js';
import type { VaeTiler, VaeTiling } from './vae.js';
import { encodesEveryItem } from './inpainting-input.js';

/**
 * A worker's memory plan: what each model really costs here (measured, not its file sizes: onnxruntime
 * arenas and activations dwarf the weights at large sizes), and a check before each batch that refuses,
 * with a message saying what to change, a batch that would not fit, rather than letting the kernel's
 * OOM killer end the worker.
 */

export class InsufficientMemoryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'InsufficientMemoryError';
  }
}

/**
 * The VAE decoder's mid-block self-attention over every latent pixel: a tokens x tokens float32 score
 * matrix, its softmax and the product's working copy. It dominates the decode at large sizes and grows
 * with the square of the pixels (measured on the SDXL export: 3.6 GiB at 1024x1024, 9.5 GiB at
 * 1792x1024; this gives 3.0 and 9.2).
 */
export function vaeAttentionBytes(layout: Pick<ModelLayout, 'vae'>, width: number, height: number): number {
  if (!layout.vae.midBlockAttention) return 0;
  const tokens = (width / layout.vae.scaleFactor) * (height / layout.vae.scaleFactor);
  return 3 * tokens * tokens * 4;
}

/**
 * Tiles of the VAE decode, in latent pixels: no smaller than this (256 image pixels with the 8x VAE;
 * smaller tiles spend most of each decoder call on overlap), overlapping by a quarter, no less than 8
 * (64 image pixels: test/tiled-vae.test.ts shows no seam at that overlap).
 */
const MIN_TILE = 32;
const MIN_OVERLAP = 8;

/**
 * The tile sides a decode may take, largest first: `largestTile` where it is shorter than the image's
 * longest side, then MIN_TILE doubled (32, 64, 128... latent pixels: 256, 512, 1024... image pixels)
 * below both. Rungs this far apart, not every multiple of 8 that fits: the tile decides the picture
 * (group norms and attention see only the tile), so a picture must not change with every MiB the
 * budget or the model's measured figures move (see MemoryPlan.imagesPerRun).
 */
function tileSides(longest: number, largestTile: number): number[] {
  const sides = largestTile < longest ? [largestTile] : [];
  const below = Math.min(longest, largestTile);
  let side = MIN_TILE;
  while (side * 2 < below) side *= 2;
  for (; side >= MIN_TILE; side /= 2) if (side < below) sides.push(side);
  return sides;
}

/**
 * How to decode an image of this latent size within `budget` bytes: whole (undefined) when it fits
 * and no side is longer than `largestTile`, else in square tiles of the largest side of tileSides
 * that fits, never smaller than MIN_TILE. `cost`: what one decoder call of width x height image
 * pixels takes (by default its attention, which dominates at large sizes).
 */
export function vaeTiling(
  layout: Pick<ModelLayout, 'vae'>,
  latentWidth: number,
  latentHeight: number,
  budget: number,
  largestTile = Infinity,
  cost = (width: number, height: number) => vaeAttentionBytes(layout, width, height),
): VaeTiling | undefined {
  const scale = layout.vae.scaleFactor;
  const longest = Math.max(latentWidth, latentHeight);
  if (longest <= largestTile && cost(latentWidth * scale, latentHeight * scale) <= budget) return undefined;
  const tile = tileSides(longest, largestTile).find((side) => cost(side * scale, side * scale) <= budget) ?? MIN_TILE;
  return { tile, overlap: Math.max(MIN_OVERLAP, Math.floor(tile / 4)) };
}

/**
 * When the VAE decodes in tiles: 'auto' only where the whole decode would not fit memory (the whole
 * decode is diffusers' picture exactly); 'always' any image with a side over 512 image pixels
 * (diffusers' tile, 64 latent pixels with the 8x VAE), which bounds the decode's memory and, where its
 * attention dominates (small-width exports, very large sizes), its time; a number of image pixels, as
 * 'always' with tiles of that side (smaller ones hold less, and cost less where attention dominates).
 */
export type VaeTilingMode = 'auto' | 'always' | number;
const ALWAYS_TILE_PIXELS = 512;

/**
 * Who gives a batch its memory. In a worker, the pool's arbiter (engine/memory-arbiter.ts), which
 * counts what the other workers' running batches planned on; in a process of its own (the CLI), what
 * is free here (localMemory).
 */
export interface MemorySource {
  /**
   * Plans a batch: `plan` gets the bytes the batch may take and says what it takes of them (undefined:
   * nothing fits), and `alone`, what it could take if no other batch ran (the same where none can).
   * What it takes stays counted until the batch ends. Where nothing fits within what other batches
   * left, but would within what is free, the source waits for one of them to end and asks again.
   * `plan` is undefined in the answer when the batch fits in neither; `budget` is what it was last
   * planned with.
   */
  reserve<T extends { bytes: number; samples: number }>(plan: (budget: number, alone: number) => T | undefined): Promise<{ plan?: T; budget: number }>;
  /**
   * Runs work whose memory is not known before it runs (a model's calibration) once no other batch
   * holds memory it planned on and has not taken yet, holding all there is until the work ends: other
   * batches wait for it, rather than plan on memory it is about to take.
   */
  exclusive<T>(work: () => Promise<T>): Promise<T>;
}

/** The memory of this process alone: what is free now, within `limit` (MEMORY_LIMIT). */
export function localMemory(limit = Infinity): MemorySource {
  return {
    async reserve(plan) {
      const budget = plannableBytes(limit);
      return { plan: plan(budget, budget), budget };
    },
    exclusive: (work) => work(),
  };
}

/** What the plan reads of a model's layout: its VAE, and whether it encodes every item (encodesEveryItem). */
type PlannedLayout = Pick<ModelLayout, 'dir' | 'vae' | 'denoiserConfig' | 'vaeEncoder'>;

/** One part of a batch as planned: its images, their samples in one denoiser call, the bytes they are expected to take, and what its decoder tiles within (see imagesPerRun). */
interface PartPlan {
  images: number;
  samples: number;
  bytes: number;
  decodeBudget: number;
}

/** Where the running batch's decode began (see MemoryPlan.vaeTiler): the peak before it, and the resident memory then. */
interface DecodeStart {
  peak: number;
  resident: number;
  /** The decode's unit (an image, or a tile of one) in pixels, and its attention. */
  pixels: number;
  attentionBytes: number;
}

/**
 * Growth of a run, as a share of what the model's arenas held before it, below which the run is taken
 * to have stayed within them (the JS heap and allocator move by a few percent run to run).
 */
const ARENA_NOISE = 0.05;

/** A model run's samples (Pipeline.samplesPerImage) of `pixels` each. */
interface RunShape {
  samples: number;
  pixels: number;
}

/** A model loaded here, as its runs' memory is told apart (see MemoryPlan.measureRun). */
interface LoadedModel {
  /** The worker's resident memory once the model loaded. */
  loadedAt: number;
  /**
   * What the model's runs left resident here: onnxruntime's arena keeps a session's largest
   * activations for the next run, so a run needs only what goes beyond them, and what a run measured
   * above its start is its need less these. Never more than the worker grew since the model loaded
   * (`loadedAt`), so memory given back shrinks it.
   */
  held: number;
  /**
   * The shapes of the runs that left `held`, each needing more than the others in some way (see
   * needsAtLeast): a run that one of them needs at least as much as found room held for all it needed,
   * and the held memory is theirs, not its own (see measureRun).
   */
  heldBy: RunShape[];
}

/**
 * Whether a run of `larger`'s shape needs at least what one of `smaller`'s does, whatever the model:
 * its samples' pixels, and their squares, add up to no less (the need is a·p + b·p² a sample, a and b
 * no less than 0: see memory-curve.ts).
 */
function needsAtLeast(larger: RunShape, smaller: RunShape): boolean {
  const [big, small] = [larger.samples * larger.pixels, smaller.samples * smaller.pixels];
  return big >= small && big * larger.pixels >= small * smaller.pixels;
}

/**
 * A model's figures measured here with the pool's, each the larger (mergeMemory); its own alone where
 * the pool's are of another version of the folder's files than the one it measured (see figuresFor).
 */
function withPooled<P extends ModelMemory | undefined>(own: ModelMemory | undefined, pooled: P): ModelMemory | P {
  return own ? mergeMemory(pooled, own) : pooled;
}

export class MemoryPlan {
  private readonly figures: Map<string, ModelMemory>;
  /**
   * The pool's figures of each model as they last came (EngineSettings.knownMemory, then adopt), kept
   * apart from `figures`: those of another version of the folder's files than this plan measured are
   * not planned with (see withPooled), but are what it starts from when it loads that version. Dropped
   * as they came, a worker holding the old files' figures when the folder was replaced (pull --force)
   * loaded the new files knowing nothing of them, and planned large sizes from its own calibration
   * alone, without its peers' larger measured sizes or their OOM kills' lessons.
   */
  private readonly pooled: Map<string, ModelMemory>;
  /** What this plan knows of each model it loaded (measureLoad) about the memory its runs hold here. */
  private readonly loaded = new Map<string, LoadedModel>();
  /** Model folders whose VAE decoder asked for this plan's tiling (see vaeTiler): their decodes are planned tiled. */
  private readonly tiledDecoders = new Set<string>();
  /** What the running batch was planned within, and what of it the VAE decoder may take (tiles are chosen to fit it). */
  private batchBudget = Infinity;
  private decodeBudget = Infinity;
  /** Set when the running batch's decode begins, if this system can measure the phases apart. */
  private decodeStart?: DecodeStart;
  /** The running batch's peak and resident memory when its VAE encoder finished (image-to-image), if it ran. */
  private encodeEnd?: { peak: number; resident: number };
  /** Whether the running batch's peak is measured from its start (resetPeak worked). */
  private exactPeak = false;

  /** Whether this system measures a run's phases apart (a resettable peak: Linux); calibrate() needs it. */
  readonly measuresPhases = resetPeak();

  /** The longest side of a tile, in image pixels (Infinity: as large as memory allows). */
  private readonly largestTilePixels: number;

  constructor(
    known: Record<string, ModelMemory> = {},
    private readonly source: MemorySource = localMemory(),
    tiling: VaeTilingMode = 'auto',
  ) {
    this.pooled = new Map(Object.entries(known));
    this.figures = new Map(this.pooled);
    this.largestTilePixels = tiling === 'auto' ? Infinity : tiling === 'always' ? ALWAYS_TILE_PIXELS : tiling;
  }

  /** Runs work whose memory is not known in advance with all the memory there is (see MemorySource.exclusive). */
  exclusive<T>(work: () => Promise<T>): Promise<T> {
    return this.source.exclusive(work);
  }

  /** The figures of a model folder, if it ran here (or in an earlier worker, see EngineSettings.knownMemory). */
  of(modelDir: string): ModelMemory | undefined {
    return this.figures.get(modelDir);
  }

  /** Plans with `pooled`, a model's figures as other workers (and earlier servers) measured them, too (see withPooled). */
  adopt(modelDir: string, pooled: ModelMemory): void {
    this.pooled.set(modelDir, pooled);
    this.figures.set(modelDir, withPooled(this.figures.get(modelDir), pooled));
  }

  /**
   * Loads a model, `version` of its folder's files, recording how much the worker grew (garbage
   * collected before and after: see settledResidentBytes). Figures measured of other files in the folder
   * are dropped (see figuresFor): it starts from the pool's figures of these files (see `pooled`), or,
   * without any, is measured and calibrated afresh.
   */
  async measureLoad<T>(modelDir: string, version: string | undefined, load: () => Promise<T>): Promise<T> {
    const before = await settledResidentBytes();
    const loaded = await load();
    const after = await settledResidentBytes();
    this.loaded.set(modelDir, { loadedAt: after, held: 0, heldBy: [] });
    const known = withPooled(figuresFor(this.figures.get(modelDir), version), figuresFor(this.pooled.get(modelDir), version));
    const measured: ModelMemory = { peakBytes: 0, peakPixels: 0, ...known, weightsBytes: Math.max(0, after - before) };
    if (version !== undefined) measured.version = version;
    this.figures.set(modelDir, measured);
    return loaded;
  }

  /**
   * The running batch's pictures are encoded (image-to-image): its denoising is measured from here, so
   * that the encoder (its attention over every pixel, its session loaded on first use) is not counted
   * as denoising, whose figures then plan plain generations at that size too.
   */
  encoded(): void {
    if (!this.exactPeak) return;
    this.encodeEnd = { peak: peakBytes(), resident: residentBytes() };
    resetPeak();
  }

  /**
   * How a model's VAE decoder should decode each image: whole while a decoder call fits what the running
   * batch planned for it, else in tiles that do (see vaeTiling). The decoder asks as its decode begins,
   * which is where this plan splits the batch's peak into its two phases. From then on this plan counts
   * that model's decodes as tiled.
   */
  vaeTiler(layout: Pick<ModelLayout, 'dir' | 'vae'>): VaeTiler {
    this.tiledDecoders.add(layout.dir);
    return (latentWidth, latentHeight) => {
      const tiling = this.tiling(layout, latentWidth, latentHeight, this.decodeBudget);
      if (this.exactPeak) {
        const scale = layout.vae.scaleFactor;
        const [width, height] = tiling ? [tiling.tile * scale, tiling.tile * scale] : [latentWidth * scale, latentHeight * scale];
        this.decodeStart = { peak: peakBytes(), resident: residentBytes(), pixels: width * height, attentionBytes: vaeAttentionBytes(layout, width, height) };
        resetPeak();
      }
      return tiling;
    };
  }

  /** How this model's decoder decodes within `budget`: tiles chosen by what a decoder call of theirs takes here (see decodeBytes). */
  private tiling(layout: Pick<ModelLayout, 'dir' | 'vae'>, latentWidth: number, latentHeight: number, budget: number): VaeTiling | undefined {
    // In latent pixels, a multiple of 8 as every tile is.
    const largestTile = Math.floor(this.largestTilePixels / layout.vae.scaleFactor / 8) * 8;
    return vaeTiling(layout, latentWidth, latentHeight, budget, largestTile, (width, height) => this.decodeBytes(layout, width, height));
  }

  /** The decoder's unit (an image, or one tile when its decoder tiles within `budget`; see vaeTiler), in pixels. */
  private decodeUnit(layout: Pick<ModelLayout, 'dir' | 'vae'>, width: number, height: number, budget: number): { width: number; height: number } {
    const scale = layout.vae.scaleFactor;
    const tiling = this.tiledDecoders.has(layout.dir) ? this.tiling(layout, width / scale, height / scale, budget) : undefined;
    return tiling ? { width: tiling.tile * scale, height: tiling.tile * scale } : { width, height };
  }

  /**
   * What the text encoders and the denoising loop take for `samples` samples of `pixels` each (see
   * memory-curve.ts and Pipeline.samplesPerImage), beyond what the model's earlier runs here left held.
   */
  private denoiseBytes(modelDir: string, samples: number, pixels: number): number {
    const figures = this.figures.get(modelDir);
    const perSample = Math.max(bytesPerImage(figures?.denoise ?? [], pixels), leastPerImage(figures?.exceeded ?? [], pixels));
    return Math.max(0, samples * perSample - (this.loaded.get(modelDir)?.held ?? 0));
  }

  /**
   * What one decoder call of width x height takes: its attention, whose size is known in closed form,
   * plus the rest of the measured call's working memory scaled by pixels.
   */
  private decodeBytes(layout: Pick<ModelLayout, 'dir' | 'vae'>, width: number, height: number): number {
    const measured = this.figures.get(layout.dir)?.decode;
    const rest = measured?.pixels ? Math.max(0, measured.bytes - measured.attentionBytes) * Math.max(1, (width * height) / measured.pixels) : 0;
    return rest + vaeAttentionBytes(layout, width, height);
  }

  /**
   * What one image of the batch's size leaves of `alone` for its decoder, which tiles within it: one
   * image's denoising taken, whatever the batch, so that its tiles, and so its picture, are those of the
   * image on its own (see imagesPerRun).
   */
  private decodeBudgetOf(modelDir: string, pixels: number, alone: number, samplesPerImage: number): number {
    return alone - this.denoiseBytes(modelDir, samplesPerImage, pixels);
  }

  /**
   * What a batch is expected to take above the loaded model: its denoising phase, whose arenas stay
   * held, plus one decoder call, tiled when its decoder tiles as one image of the size would be within
   * `alone` (decodeBudgetOf). Image-to-image first encodes each picture whole, before the denoising
   * takes its memory, as an inpainting model encodes a blank picture for text-to-image
   * (encodesEveryItem): the VAE encoder mirrors the decoder (the same mid-block attention over the
   * latent pixels), so one whole decoder call of the size stands for it. `samplesPerImage`: see
   * Pipeline.samplesPerImage.
   */
  estimate(layout: PlannedLayout, batch: Pick<GenerationBatch, 'width' | 'height' | 'items'>, alone: number, samplesPerImage = 1): number {
    const denoise = this.denoiseBytes(layout.dir, batch.items.length * samplesPerImage, batch.width * batch.height);
    const unit = this.decodeUnit(layout, batch.width, batch.height, this.decodeBudgetOf(layout.dir, batch.width * batch.height, alone, samplesPerImage));
    const generate = denoise + this.decodeBytes(layout, unit.width, unit.height);
    const encodes = encodesEveryItem(layout) || batch.items.some((item) => item.image);
    const encode = encodes ? this.decodeBytes(layout, batch.width, batch.height) : 0;
    return Math.max(encode, generate);
  }

  /**
   * How many of the batch's images one model call may hold within the memory its source gives: all of
   * them, or fewer (the batch then runs in parts, as its max_batch would have it). Throws
   * InsufficientMemoryError when not even one fits.
   *
   * Whether and how the decoder tiles is chosen as one image of the size would be decoded alone
   * (decodeBudgetOf, within the source's `alone`), never from what other batches left or from how many
   * images share the run: planned from those, the same seed drew another picture beside other
   * requests, merged into a batch, or in a request of n images (tiles of 104 latent pixels alone, of 40
   * in a batch of three: up to 73/255 apart). A part whose decode does not fit what is left runs fewer
   * images, or waits for the other batches (see MemorySource.reserve).
   */
  async imagesPerRun(layout: PlannedLayout, batch: Pick<GenerationBatch, 'width' | 'height' | 'items'>, modelName: string, samplesPerImage = 1): Promise<number> {
    const need = (count: number, alone: number) => this.estimate(layout, { ...batch, items: batch.items.slice(0, count) }, alone, samplesPerImage);
    const { plan, budget } = await this.source.reserve((budget, alone): PartPlan | undefined => {
      for (let count = batch.items.length; count >= 1; count--) {
        const bytes = need(count, alone);
        if (bytes <= budget) {
          const decodeBudget = this.decodeBudgetOf(layout.dir, batch.width * batch.height, alone, samplesPerImage);
          return { images: count, samples: count * samplesPerImage, bytes, decodeBudget };
        }
      }
      return undefined;
    });
    if (!plan) {
      throw new InsufficientMemoryError(
        `Model '${modelName}' needs about ${formatBytes(need(1, budget))} of memory to make an image of ${batch.width}x${batch.height}` +
          ` and batches may plan on ${formatBytes(budget)} now (90% of what is free, within MEMORY_LIMIT if set). Ask for a smaller size, or free memory: fewer WORKERS (each holds its own models), a lower MODEL_MEMORY_BUDGET, or a higher MEMORY_LIMIT.`,
      );
    }
    this.batchBudget = budget;
    this.decodeBudget = plan.decodeBudget;
    return plan.images;
  }

  /**
   * A run of `samples` samples of `pixels` each that onnxruntime could not allocate, though planned
   * within the running batch's budget: each of them needed more than its share of it (ModelMemory.exceeded).
   */
  recordExceeded(modelDir: string, samples: number, pixels: number): void {
    if (this.batchBudget === Infinity) return;
    this.figures.set(modelDir, mergeMemory(this.figures.get(modelDir), exceededFigures(pixels, this.batchBudget, samples)));
  }

  /**
   * Runs `samples` samples (Pipeline.samplesPerImage) of `pixels` each, recording what they took in the model's figures: on Linux
   * the denoising and the decode apart, elsewhere the whole run as denoising (an upper bound: the
   * decode's attention is then counted twice). A run that stayed within what the model's arenas already
   * held says only that it needed no more than that, and adds no denoising figure. Nor does a run that
   * grew beyond what an earlier run needing at least as much left held (see heldBy): that memory is the
   * earlier run's, and what this one took of it is unknown. Counted as its own, as it was, each small run
   * after large ones (or after a worker's heap and allocator grew under other traffic) recorded their
   * memory as its need: its size's figure only grows (mergeSamples), and the curve scales the smaller
   * sizes up by the square, so under mixed traffic a server came to plan 4 GiB for a 1024x1024 image it
   * had served within 100 MiB, refusing each with 507. The growth still counts in `held` for what follows.
   */
  async measureRun<T>(modelDir: string, samples: number, pixels: number, run: () => Promise<T>): Promise<T> {
    this.exactPeak = resetPeak();
    this.decodeStart = undefined;
    this.encodeEnd = undefined;
    const before = residentBytes();
    // A model this plan did not see load (a test's) holds nothing it could tell apart.
    const loaded = this.loaded.get(modelDir);
    const held = loaded?.held ?? 0;
    const result = await run();
    const after = residentBytes();
    if (loaded) loaded.held = Math.max(0, Math.min(held + after - before, after - loaded.loadedAt));
    // Without a resettable high-water mark the peak may be an earlier batch's: still an upper bound.
    const end = this.exactPeak ? peakBytes() : Math.max(peakBytes(), residentBytes());
    // Set by the tiler during run(), which the compiler cannot see.
    const start = this.decodeStart as DecodeStart | undefined;
    const encoded = this.encodeEnd as { peak: number; resident: number } | undefined;
    const grew = Math.max(0, (start?.peak ?? end) - (encoded?.resident ?? before));
    const shape = { samples, pixels };
    const foundRoom = loaded?.heldBy.some((earlier) => needsAtLeast(earlier, shape)) ?? false;
    const ownNeed = grew > held * ARENA_NOISE && (held === 0 || !foundRoom);
    if (loaded && !foundRoom) loaded.heldBy = [...loaded.heldBy.filter((earlier) => !needsAtLeast(shape, earlier)), shape];
    const reported: ModelMemory = {
      weightsBytes: 0,
      peakBytes: Math.max(0, Math.max(end, start?.peak ?? 0, encoded?.peak ?? 0) - before) + held,
      peakPixels: samples * pixels,
      ...(ownNeed && { denoise: [{ pixels, bytes: (grew + held) / samples }] }),
      ...(start && { decode: { bytes: Math.max(0, end - start.resident), pixels: start.pixels, attentionBytes: start.attentionBytes } }),
    };
    this.figures.set(modelDir, mergeMemory(this.figures.get(modelDir), reported));
    return result;
  }
}
