import type { GenerationBatch, RgbImage } from '../runtime/types.js';
import type { ModelLayout } from '../models/layout.js';

export type { RgbImage };

export interface GenerateHooks {
  /** Called after each denoising step of the batch. */
  onStep?(step: number, total: number): void;
  /** Polled before each step; true stops the generation with a `GenerationCancelled`. */
  shouldStop?(): boolean;
  /** Whether previews are wanted after this step (asked for every step but the last). */
  previewAt?(step: number, total: number): boolean;
  /** The batch's pictures as the loop predicts them after `step`, one per item: a cheap approximation (preview.ts). */
  onPreview?(images: RgbImage[], step: number, total: number): Promise<void>;
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
  generate(batch: GenerationBatch, hooks?: GenerateHooks): Promise<RgbImage[]>;
  release(): Promise<void>;
}
