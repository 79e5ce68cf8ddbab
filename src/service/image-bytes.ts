import type { BatchItem, GenerationBatch } from '../runtime/types.js';

/**
 * The sum of `bytesOf` over every image `batches` will make, told its pixels and its item (its output
 * format, its previews): what the store (store-space.ts) and ANSWER_MEMORY (answer-size.ts) set aside
 * for a request's images before any is made, each with its own bytes per image.
 */
export function sumOverImages(batches: readonly GenerationBatch[], bytesOf: (pixels: number, item: BatchItem) => number): number {
  return batches.reduce((sum, { width, height, items }) => sum + items.reduce((bytes, item) => bytes + bytesOf(width * height, item), 0), 0);
}
