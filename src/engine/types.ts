/** The engine's unit of work and its result; the HTTP layer builds batches, the workers run them. */

export type OutputFormat = 'png' | 'jpeg' | 'webp';

/** Each output format's content type and file extension: the one table the encoder, store, routes and CLI use. */
export const IMAGE_FORMATS = {
  png: { contentType: 'image/png', extension: 'png' },
  jpeg: { contentType: 'image/jpeg', extension: 'jpg' },
  webp: { contentType: 'image/webp', extension: 'webp' },
} as const satisfies Record<OutputFormat, { contentType: string; extension: string }>;

export type ImageExtension = (typeof IMAGE_FORMATS)[OutputFormat]['extension'];
export const IMAGE_EXTENSIONS = Object.values(IMAGE_FORMATS).map((f) => f.extension);

export interface BatchItem {
  prompt: string;
  /** Empty string when the request has none (the family decides what "none" means, e.g. SDXL zeros). */
  negativePrompt: string;
  /** Reproduces this image on its own with the same prompt and settings. */
  seed: number;
}

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
  outputFormat: OutputFormat;
  /** Most images one model call may hold for this model; merging compatible requests stays within it. */
  maxBatch?: number;
  /** 0..100, for jpeg and webp. */
  outputCompression?: number;
  items: BatchItem[];
}

export interface GeneratedImage {
  /** The encoded image file. */
  data: Uint8Array;
  contentType: string;
  seed: number;
}

/** A model folder at one version (see GenerationBatch.modelVersion). */
export interface ModelRef {
  dir: string;
  version?: string;
}

/** What the HTTP layer needs from the engine. */
export interface Engine {
  generate(batch: GenerationBatch, signal?: AbortSignal): Promise<GeneratedImage[]>;
  close(): Promise<void>;
}
