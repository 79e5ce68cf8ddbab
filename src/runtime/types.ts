import type { NoiseSource } from './random.js';

/** The engine's unit of work and its result; the service plans batches (service/plan.ts), the workers run them. */

export type OutputFormat = 'png' | 'jpeg' | 'webp';

/** Each output format's content type and file extension: the one table the encoder, store, routes and CLI use. */
export const IMAGE_FORMATS = {
  png: { contentType: 'image/png', extension: 'png' },
  jpeg: { contentType: 'image/jpeg', extension: 'jpg' },
  webp: { contentType: 'image/webp', extension: 'webp' },
} as const satisfies Record<OutputFormat, { contentType: string; extension: string }>;

export type ImageExtension = (typeof IMAGE_FORMATS)[OutputFormat]['extension'];
export const IMAGE_EXTENSIONS = Object.values(IMAGE_FORMATS).map((f) => f.extension);

/** Raw 8-bit RGB pixels, row-major, 3 channels. */
export interface RgbImage {
  pixels: Uint8Array;
  width: number;
  height: number;
}

export interface ImageOutput {
  format: OutputFormat;
  /** 0..100, for jpeg and webp. */
  compression?: number;
}

export interface BatchItem extends NoiseSource {
  prompt: string;
  /**
   * Undefined when the request (and the model's preset) gives none, which is not the empty prompt: the
   * family decides what none means (SDXL conditions on zeros, as diffusers does for negative_prompt=None
   * under force_zeros_for_empty_prompt; the others encode the empty prompt), while '' is encoded.
   */
  negativePrompt?: string;
  /** Reproduces this image on its own with the same prompt, settings and `rng`. */
  seed: number;
  /** Image-to-image: the picture to start from, at the batch's size (see GenerationBatch.strength). */
  image?: RgbImage;
  /** Inpainting: one byte per pixel of `image`, 255 where the picture is to be repainted, 0 where kept. */
  mask?: Uint8Array;
  /**
   * How this image is encoded (PNG when absent). Per item, not per batch: requests that differ only in
   * their file format share one denoising loop.
   */
  output?: ImageOutput;
  /**
   * Streaming: how many previews of this image to send while it is denoised (0..3, none when absent),
   * spread evenly over the loop (see previewSteps). Per item: it does not keep requests from merging.
   */
  partialImages?: number;
}

/**
 * The most denoising steps a run takes: the API's limit, and the bound of what a model's imagegen.json
 * and a golden file may ask (far above any schedule's use; a huge count would only exhaust memory).
 */
export const MAX_STEPS = 150;

/** The strongest classifier-free guidance a run takes: the API's limit, and the bound of a model's imagegen.json presets. */
export const MAX_GUIDANCE_SCALE = 30;

/**
 * Requests for the same model, size and settings share one denoising loop; each item keeps its own
 * prompt and seed.
 */
export interface GenerationBatch {
  /** Absolute path of the model folder. */
  modelDir: string;
  /** The registry's version of that folder: a new one (a model replaced in place) makes workers reload it. */
  modelVersion?: string;
  width: number;
  height: number;
  steps: number;
  guidanceScale: number;
  /** diffusers' guidance_rescale (0 = off): counters over-exposure at high guidance. */
  guidanceRescale?: number;
  /** Scheduler name override (see src/schedulers/index.ts); undefined uses scheduler_config.json. */
  scheduler?: string;
  /**
   * Image-to-image (every item then has an `image`): how much of the schedule runs from the items'
   * pictures, in (0, 1]; 1 noises them fully, small values keep them (diffusers' strength).
   */
  strength?: number;
  /**
   * The denoiser passes the batch makes: the steps its strength leaves (all without one), plus PNDM's
   * repeated one (see passesRun). What its cost grows with (engine/cost-model.ts); one that does not say
   * (a calibration's) makes one per step.
   */
  passes?: number;
  /** Most images one model call may hold for this model; merging compatible requests stays within it. */
  maxBatch?: number;
  items: BatchItem[];
}

export interface GeneratedImage {
  /** The encoded image file. */
  data: Uint8Array;
  contentType: string;
  seed: number;
}

/**
 * A batch's pictures or images, each item's, where none may be missing: an item goes without one only
 * where its client left a batch that others stay in (see WorkerRuntime.runMerged), and such an item's
 * was asked for by nobody.
 */
export function everyItemMade<T>(made: readonly (T | undefined)[]): T[] {
  if (made.some((one) => one === undefined)) throw new Error('internal error: an item of the batch was left without its picture');
  return made as T[];
}

/**
 * What a running batch tells whoever asked for it while it runs, in order; its images (or its error)
 * end the stream. The worker sends these, the pool routes them to the requests of a merged batch (item
 * numbers then count within each request), and the service (a streamed request's events), the CLI and the watchdog consume them.
 */
export type BatchEvent =
  /** Denoising steps done out of the batch's total (a batch split in parts counts all of them). */
  | { type: 'step'; step: number; total: number }
  /** Item `item`'s `index`-th preview (0-based), encoded like the item's final image. */
  | { type: 'preview'; item: number; index: number; image: GeneratedImage };

/**
 * The steps (1-based, of `total`) after which an item asking for `count` previews gets one: evenly
 * spread, never after the last step (that is the image itself), so a short loop sends fewer.
 */
export function previewSteps(count: number, total: number): number[] {
  const steps = Array.from({ length: count }, (_, j) => Math.round(((j + 1) * total) / (count + 1)));
  return [...new Set(steps)].filter((step) => step >= 1 && step < total);
}

/** A model folder at one version (see GenerationBatch.modelVersion). */
export interface ModelRef {
  dir: string;
  version?: string;
}

/** An item's encoding: its own, or PNG. */
export const outputOf = (item: Pick<BatchItem, 'output'>): ImageOutput => item.output ?? { format: 'png' };
