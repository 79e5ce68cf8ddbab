import type { GenerationBatch, RgbImage } from '../runtime/types.js';
import type { ModelLayout } from '../models/layout.js';

export type { RgbImage };

export interface GenerateHooks {
  /** Called after each denoising step of the batch. */
  onStep?(step: number, total: number): void;
  /** Polled before each step; true stops the generation with a `GenerationCancelled`. */
  shouldStop?(): boolean;
  /** The batch's items (by number) that want a preview after this step; none, no preview (asked for every step but the last). */
  previewsAt?(step: number, total: number): readonly number[];
  /** Those items' pictures as the loop predicts them after `step`: a cheap approximation (preview.ts). */
  onPreview?(previews: readonly { item: number; image: RgbImage }[], step: number, total: number): Promise<void>;
  /**
   * Asked of each item (by number) as its turn to be decoded comes: false, and it is not (its client
   * left a batch that others stay in), which spares a decoder call of seconds on a CPU. All by default.
   */
  wanted?(item: number): boolean;
}

export class GenerationCancelled extends Error {
  constructor() {
    super('generation cancelled');
    this.name = 'GenerationCancelled';
  }
}

/** A loaded model that turns a batch into pictures, one per item, in item order. */
export interface Pipeline {
  readonly layout: ModelLayout;
  /**
   * Samples of each image that one denoiser call holds: 2 with classifier-free guidance (the
   * unconditional copy rides along), else 1. Memory is measured and planned per sample.
   */
  samplesPerImage(batch: Pick<GenerationBatch, 'guidanceScale'>): number;
  /** One picture per item, in item order; none for an item `hooks.wanted` turned down. */
  generate(batch: GenerationBatch, hooks?: GenerateHooks): Promise<(RgbImage | undefined)[]>;
  release(): Promise<void>;
}
