import sharp, { type JpegOptions, type PngOptions, type WebpOptions } from 'sharp';
import type { RgbImage } from './pipeline.js';
import { bufferView } from '../util/bytes.js';
import type { OutputFormat } from '../runtime/types.js';

/**
 * Encoder settings chosen by measurement (`npx tsx bench/encoders.ts`; the figures are in
 * docs/performance.md). The quality of WebP and JPEG is the request's; these settings only trade the
 * encoder's time against the file's size:
 * - PNG: zlib level 1 with adaptive row filtering. sharp's default (level 6, no filtering) spends its
 *   time on zlib effort that buys little, while filtering is what shrinks a photo: on a photo-like
 *   picture about half the time for a file a third smaller; flat pictures half the time, files larger.
 * - WebP: effort 0 instead of 4 gives the same pixels (the quality decides them) in a third of the
 *   time or less, for files up to a third larger.
 * - JPEG: libjpeg-turbo's defaults are already the fast path (mozjpeg's trellis search is ~10x slower
 *   for files ~20% smaller).
 */
export const ENCODER_SETTINGS = {
  png: { compressionLevel: 1, adaptiveFiltering: true },
  webp: { effort: 0 },
  jpeg: {},
} as const satisfies { png: PngOptions; webp: WebpOptions; jpeg: JpegOptions };

/** Encodes raw RGB as the requested file format; `compression` is OpenAI's 0..100 (100 = best quality). */
export async function encodeImage(image: RgbImage, format: OutputFormat, compression?: number): Promise<Uint8Array> {
  const img = sharp(bufferView(image.pixels), {
    raw: { width: image.width, height: image.height, channels: 3 },
  });
  // OpenAI's default output_compression is 100. Its 0 is sharp's 1, the lowest it takes (libjpeg
  // itself reads a quality of 0 as 1).
  const quality = Math.max(1, compression ?? 100);
  const encoded =
    format === 'png' ? img.png(ENCODER_SETTINGS.png) : format === 'jpeg' ? img.jpeg({ ...ENCODER_SETTINGS.jpeg, quality }) : img.webp({ ...ENCODER_SETTINGS.webp, quality });
  return encoded.toBuffer();
}
