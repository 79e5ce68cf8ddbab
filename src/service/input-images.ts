import sharp from 'sharp';
import { ApiError, quoteList } from '../api/errors.js';
import type { RgbImage } from '../runtime/types.js';

/**
 * The pictures of edits and variations: decoded once with sharp (the format read from the bytes, never
 * from a part's content type, which the SDKs send as octet-stream), checked, and later fitted to the
 * size the request runs at. OpenAI's masks are pictures whose fully transparent pixels mark where to
 * edit; the pipelines take one byte per pixel, 255 where to repaint.
 */

const INPUT_FORMATS = ['png', 'jpeg', 'webp'] as const;
/** Largest side of an input picture: bounds the memory one decode takes (4096 x 4096 RGBA is 64 MiB). */
const MAX_INPUT_SIDE = 4096;
/** Alpha below this, once fitted (resizing blends edges), counts as transparent: repaint. */
const TRANSPARENT_BELOW = 128;

/** A decoded picture: raw RGBA at its own size, upright (EXIF orientation applied). */
export interface InputImage {
  rgba: Buffer;
  width: number;
  height: number;
  /** Whether the file had an alpha channel (a mask must). */
  hasAlpha: boolean;
}

/** What an edit starts from; `mask` is absent when the request sent none. */
export interface EditSource {
  image: InputImage;
  mask?: InputImage;
}

/** Decodes one uploaded picture; `param` names it in the 400s (`image`, `mask`, `images[0].image_url`). */
export async function decodeInputImage(bytes: Buffer, param: string): Promise<InputImage> {
  const unsupported = `Invalid file '${param}': unsupported image format. Supported formats are: ${quoteList(INPUT_FORMATS)}.`;
  if (bytes.length === 0) throw ApiError.invalid(param, 'invalid_image_format', `Invalid file '${param}': the file is empty. Send a ${quoteList(INPUT_FORMATS)} picture.`);
  const tooLarge = (size: string) =>
    ApiError.invalid(param, 'image_too_large', `Invalid file '${param}': the image is ${size}; its sides may be at most ${MAX_INPUT_SIDE} pixels. Scale it down first.`);
  const metadata = await sharp(bytes)
    .metadata()
    .catch((err: Error) => {
      // sharp refuses to read the header of a picture beyond its own pixel limit (about 16384 x 16384).
      throw /pixel limit/i.test(err.message) ? tooLarge('larger than sharp will decode') : ApiError.invalid(param, 'invalid_image_format', unsupported);
    });
  if (!(INPUT_FORMATS as readonly string[]).includes(metadata.format)) throw ApiError.invalid(param, 'invalid_image_format', unsupported);
  if (metadata.width > MAX_INPUT_SIDE || metadata.height > MAX_INPUT_SIDE) throw tooLarge(`${metadata.width}x${metadata.height}`);
  try {
    const { data, info } = await sharp(bytes).rotate().ensureAlpha().raw().toBuffer({ resolveWithObject: true });
    return { rgba: data, width: info.width, height: info.height, hasAlpha: metadata.hasAlpha };
  } catch {
    throw ApiError.invalid(param, 'invalid_image_format', `Invalid file '${param}': the ${metadata.format} file is damaged and could not be decoded.`);
  }
}

/** Checks a mask against its picture, as OpenAI does: the same size, with an alpha channel. */
export function checkMask({ image, mask }: EditSource): void {
  if (!mask) return;
  if (mask.width !== image.width || mask.height !== image.height) {
    throw ApiError.invalid(
      'mask',
      'invalid_mask',
      `Invalid file 'mask': the mask is ${mask.width}x${mask.height} but the image is ${image.width}x${image.height}; they must be the same size.`,
    );
  }
  if (!mask.hasAlpha) {
    throw ApiError.invalid(
      'mask',
      'invalid_mask',
      "Invalid file 'mask': the mask has no alpha channel. Send a PNG (or WebP) with transparency: its fully transparent pixels mark where the image is edited.",
    );
  }
}

function hasTransparentPixel({ rgba, hasAlpha }: InputImage): boolean {
  if (!hasAlpha) return false;
  for (let i = 3; i < rgba.length; i += 4) if (rgba[i] === 0) return true;
  return false;
}

/**
 * What marks where an edit repaints: its mask, or without one, an image with fully transparent pixels
 * is its own mask (dall-e-2's rule); undefined when the whole picture is edited.
 */
export function editMarks({ image, mask }: EditSource): InputImage | undefined {
  return mask ?? (hasTransparentPixel(image) ? image : undefined);
}

/** The picture resized to cover width x height and centre-cropped, as RGBA. */
async function fit(input: InputImage, width: number, height: number): Promise<Buffer> {
  return sharp(input.rgba, { raw: { width: input.width, height: input.height, channels: 4 } })
    .resize(width, height, { fit: 'cover', position: 'centre' })
    .raw()
    .toBuffer();
}

/** The edit's picture and mask (where to repaint, see editMarks; none: everywhere) at the size the request runs at. */
export async function fitEdit({ image, mask: marks }: EditSource, width: number, height: number): Promise<{ image: RgbImage; mask?: Uint8Array }> {
  const rgba = await fit(image, width, height);
  const pixels = new Uint8Array(width * height * 3);
  for (let p = 0; p < width * height; p++) pixels.set(rgba.subarray(p * 4, p * 4 + 3), p * 3);
  const fitted = { pixels, width, height };
  if (!marks) return { image: fitted };
  const alpha = marks === image ? rgba : await fit(marks, width, height);
  const repaint = new Uint8Array(width * height);
  for (let p = 0; p < repaint.length; p++) repaint[p] = alpha[p * 4 + 3] < TRANSPARENT_BELOW ? 255 : 0;
  return { image: fitted, mask: repaint };
}
