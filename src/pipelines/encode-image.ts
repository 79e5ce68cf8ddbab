import sharp from 'sharp';
import type { RgbImage } from './pipeline.js';
import { bufferView } from '../util/bytes.js';
import type { OutputFormat } from '../runtime/types.js';

/** Encodes raw RGB as the requested file format; `compression` is OpenAI's 0..100 (100 = best quality). */
export async function encodeImage(image: RgbImage, format: OutputFormat, compression?: number): Promise<Uint8Array> {
  const img = sharp(bufferView(image.pixels), {
    raw: { width: image.width, height: image.height, channels: 3 },
  });
  // OpenAI's default output_compression is 100.
  const quality = compression ?? 100;
  const encoded = format === 'png' ? img.png() : format === 'jpeg' ? img.jpeg({ quality }) : img.webp({ quality });
  return encoded.toBuffer();
}
