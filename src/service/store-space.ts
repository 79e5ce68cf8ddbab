import { outputOf, type GenerationBatch, type OutputFormat } from '../runtime/types.js';
import { spaceOf } from '../store/space.js';
import { sumOverImages } from './image-bytes.js';

/**
 * What a url request's images are expected to take in the image store, reserved before they are
 * generated: a full store then refuses the request before any work is spent on it.
 */

/**
 * Bytes per pixel an encoded image is expected to take: PNG of RGB (noisy pictures barely compress),
 * lossy formats far less. An estimate, not answer-size.ts's bound (PNG 3.5, JPEG 3, WebP 4, reached
 * only by noise): reserving the bound would hold three or four times what photos take while they are
 * made, and turn url requests away from a store with room for them. An image past its estimate is
 * checked against what is left (StoreSpace.claim), so only a store about full then answers 507 late.
 */
const BYTES_PER_PIXEL: Record<OutputFormat, number> = { png: 3, jpeg: 1, webp: 1 };
/** Headers and metadata of one file. */
const FILE_OVERHEAD = 1024;

/** Each image as the store counts it (spaceOf: at least a disk block), so that a small image's put never claims more than was reserved. */
export function expectedStoreBytes(batches: readonly GenerationBatch[]): number {
  return sumOverImages(batches, (pixels, item) => spaceOf(pixels * BYTES_PER_PIXEL[outputOf(item).format] + FILE_OVERHEAD));
}
