import pLimit from 'p-limit';
import sharp, { type Sharp, type SharpOptions } from 'sharp';
import { ApiError, quoteList } from '../api/errors.js';
import type { RgbImage } from '../runtime/types.js';
import { jpegScans } from './jpeg-scans.js';

/**
 * The pictures of edits and variations: checked with sharp (the format read from the bytes, never
 * from a part's content type, which the SDKs send as octet-stream), and later fitted to the size the
 * request runs at. OpenAI's masks are pictures whose fully transparent pixels mark where to
 * edit; the pipelines take one byte per pixel, 255 where to repaint.
 */

const INPUT_FORMATS = ['png', 'jpeg', 'webp'] as const;
type InputFormat = (typeof INPUT_FORMATS)[number];
/** Largest side of an input picture: bounds the work and memory of one decode (4096 x 4096 RGBA is 64 MiB). */
const MAX_INPUT_SIDE = 4096;
/** Most scans of a JPEG (jpeg-scans.ts): with the side, bounds the work of one decode (0.25 s at 4096 x 4096). */
const MAX_JPEG_SCANS = 100;
/**
 * How an upload is decoded: refused on a decoder's error (a file cut short, corrupt compressed data), not
 * on its warnings. sharp's default also fails on warnings, and so refused photos every viewer shows:
 * Samsung phones write JPEGs whose scan header libjpeg warns about ("Invalid SOS parameters for
 * sequential JPEG"), other cameras stray bytes before a marker.
 */
const DECODE: SharpOptions = { failOn: 'error' };

/**
 * An uploaded picture, checked: decoded once to be sure it can be (and to find fully transparent
 * pixels), but kept as the file. It is decoded again only as it is fitted to the request's size: held
 * decoded at its own size, a 4096 x 4096 picture would take 64 MiB for as long as its request waits.
 */
export interface InputImage {
  bytes: Buffer;
  /** Its size upright (EXIF orientation applied). */
  width: number;
  height: number;
  /** Whether its EXIF orientation turns it a quarter: its stored pixels are height x width. */
  turned: boolean;
  /** Whether the file has an alpha channel (a mask must). */
  hasAlpha: boolean;
  /** Whether some pixel is fully transparent (see editMarks). */
  hasTransparentPixel: boolean;
  /** Its format and what it was sent as (`image`, `mask`, `images[0].image_url`), for errors. */
  format: string;
  param: string;
}

/** What an edit starts from; `mask` is absent when the request sent none. */
export interface EditSource {
  image: InputImage;
  mask?: InputImage;
}

const damaged = (param: string, format: string) =>
  ApiError.invalid(
    param,
    'invalid_image_format',
    `Invalid file '${param}': the ${format} file is damaged and could not be decoded (cut short or corrupt). Send the original file again, or save it anew from an image editor.`,
  );

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

/**
 * The format a file's first bytes announce. sharp cannot read the header of a WebP cut short (its RIFF
 * header gives the whole file's length) nor of a JPEG damaged before its pixels: such a file is damaged,
 * and an answer naming the formats taken, its own among them, would not say what is wrong.
 */
function announcedFormat(bytes: Buffer): InputFormat | undefined {
  if (bytes.subarray(0, 8).equals(PNG_SIGNATURE)) return 'png';
  if (bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff) return 'jpeg';
  if (bytes.toString('latin1', 0, 4) === 'RIFF' && bytes.toString('latin1', 8, 12) === 'WEBP') return 'webp';
  return undefined;
}

/** Checks one uploaded picture; `param` names it in the 400s (`image`, `mask`, `images[0].image_url`). */
export async function decodeInputImage(bytes: Buffer, param: string): Promise<InputImage> {
  const unsupported = `Invalid file '${param}': unsupported image format. Supported formats are: ${quoteList(INPUT_FORMATS)}.`;
  if (bytes.length === 0) throw ApiError.invalid(param, 'invalid_image_format', `Invalid file '${param}': the file is empty. Send a ${quoteList(INPUT_FORMATS, 'or')} picture.`);
  const tooLarge = (size: string) =>
    ApiError.invalid(param, 'image_too_large', `Invalid file '${param}': the image is ${size}; its sides may be at most ${MAX_INPUT_SIDE} pixels. Scale it down first.`);
  const metadata = await sharp(bytes, DECODE)
    .metadata()
    .catch((err: Error) => {
      // sharp refuses to read the header of a picture beyond its own pixel limit (about 16384 x 16384).
      if (/pixel limit/i.test(err.message)) throw tooLarge('larger than sharp will decode');
      const announced = announcedFormat(bytes);
      throw announced ? damaged(param, announced) : ApiError.invalid(param, 'invalid_image_format', unsupported);
    });
  if (!(INPUT_FORMATS as readonly string[]).includes(metadata.format)) throw ApiError.invalid(param, 'invalid_image_format', unsupported);
  if (metadata.width > MAX_INPUT_SIDE || metadata.height > MAX_INPUT_SIDE) throw tooLarge(`${metadata.width}x${metadata.height}`);
  if (metadata.format === 'jpeg' && jpegScans(bytes, MAX_JPEG_SCANS) > MAX_JPEG_SCANS) {
    throw ApiError.invalid(
      param,
      'invalid_image_format',
      `Invalid file '${param}': the JPEG is stored in more than ${MAX_JPEG_SCANS} scans (encoders write about 10; more only make it slow to decode). Save it anew from an image editor, or send it as PNG.`,
    );
  }
  // Every pixel is decoded here, so that a damaged file fails before its request queues: one channel of
  // it, the alpha where there is one, whose zeros are the picture's fully transparent pixels (in 8 bits).
  // It is held for the few milliseconds this takes, at most 16 MiB. (sharp's stats() decodes without
  // holding anything, but also works out the entropy and sharpness of the whole picture: 1.8 s of a
  // core for a 4096x4096 upload, against 0.05 s.) Alpha is channel 3 whatever the file stores: sharp
  // turns a grey picture to sRGB before it extracts a channel, so the file's last channel (1 of a
  // grey-and-alpha PNG) was its grey, whose black pixels read as transparent (an opaque line drawing
  // was refused as a mask that marks nothing) and whose transparent ones as opaque.
  const channel = await sharp(bytes, DECODE)
    .extractChannel(metadata.hasAlpha ? 'alpha' : 0)
    .raw({ depth: 'uchar' })
    .toBuffer()
    .catch(() => {
      throw damaged(param, metadata.format);
    });
  const { width, height } = metadata.autoOrient;
  const hasTransparentPixel = metadata.hasAlpha && channel.includes(0);
  const turned = width !== metadata.width;
  return { bytes, width, height, turned, hasAlpha: metadata.hasAlpha, hasTransparentPixel, format: metadata.format, param };
}

/** Checks a mask against its picture, as OpenAI does: the same size, with an alpha channel. */
export function checkMask({ image, mask }: EditSource): void {
  if (!mask) return;
  if (mask.width !== image.width || mask.height !== image.height) {
    throw ApiError.invalid(
      'mask',
      'invalid_mask',
      `Invalid file 'mask': the mask is ${mask.width}x${mask.height} but the image is ${image.width}x${image.height}; they must be the same size.${turnedHint({ image, mask })}`,
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

/**
 * Why a mask may have the image's sides swapped: a phone photo's pixels are stored sideways with an
 * EXIF orientation, which the edit applies (as viewers do), while a mask made from the stored pixels
 * (PIL's Image.open gives them so) is sideways. Empty where that is not the case.
 */
function turnedHint({ image, mask }: Required<EditSource>): string {
  if (mask.width !== image.height || mask.height !== image.width) return '';
  if (image.turned) {
    return ` The image's EXIF orientation turns it upright to ${image.width}x${image.height}, and the edit uses it upright: draw the mask on the upright picture (in PIL, after ImageOps.exif_transpose).`;
  }
  // The other way round: a mask that kept a photo's EXIF orientation (its metadata copied) is turned
  // too, where the picture it was drawn on is not; its stored size, which editors show, matches.
  if (mask.turned) {
    return ` The mask's EXIF orientation turns it upright to ${mask.width}x${mask.height}, and the edit uses it upright: save the mask without that orientation (without its EXIF metadata).`;
  }
  return '';
}

/**
 * What marks where an edit repaints: its mask, or without one, an image with fully transparent pixels
 * is its own mask (dall-e-2's rule); undefined when the whole picture is edited.
 */
export function editMarks({ image, mask }: EditSource): InputImage | undefined {
  return mask ?? (image.hasTransparentPixel ? image : undefined);
}

/** How an edit's picture and mask cover the size the request runs at: scaled to cover it, centre-cropped. */
const COVER = { fit: 'cover', position: 'centre' } as const;

/**
 * How many pictures fitColour holds decoded whole at once: up to 48 MiB each (4096 x 4096 RGB), from a
 * file that may weigh a few hundred KiB (a flat picture), which is all UPLOAD_MEMORY counts. sharp's jobs
 * take turns on libuv's four threads in the order they come, so without turns every request's first
 * pass ran before any second one, each holding its whole picture meanwhile: 24 edits sent at once took
 * a gigabyte (test/input-images.test.ts). p-limit runs two at a time, the rest in the order they came.
 */
const wholeDecodes = pLimit(2);

/**
 * `first`'s raw pixels at their own size, then fitted to the size (COVER) and passed through `then`: two
 * passes, for what libvips would otherwise do after resizing, taking turns (wholeDecodes).
 */
function fitAfter(first: Sharp, width: number, height: number, then: (fitted: Sharp) => Sharp = (fitted) => fitted): Promise<Buffer> {
  return wholeDecodes(async () => {
    const { data, info } = await first.raw().toBuffer({ resolveWithObject: true });
    return then(sharp(data, { raw: { width: info.width, height: info.height, channels: info.channels } }).resize(width, height, COVER)).raw().toBuffer();
  });
}

/**
 * The picture's colour (RGB), upright and fitted to the size (COVER), its fully transparent pixels in their
 * stored colour, as diffusers' convert('RGB') before its resize keeps them (and this server at the
 * model's own size). libvips resizes a picture with alpha premultiplied by it, which turns those pixels
 * black, and sharp drops alpha only after resizing: so a picture with alpha has it dropped in a pass of
 * its own first.
 */
async function fitColour(input: InputImage, width: number, height: number): Promise<Buffer> {
  try {
    if (!input.hasAlpha) return await sharp(input.bytes, DECODE).rotate().resize(width, height, COVER).raw().toBuffer();
    return await fitAfter(sharp(input.bytes, DECODE).rotate().removeAlpha(), width, height);
  } catch {
    throw damaged(input.param, input.format);
  }
}

/**
 * Where a mask (or a picture that is its own mask) repaints, upright and fitted as the picture is: 255
 * where to repaint. Which pixels a mask repaints is OpenAI's rule, its fully transparent ones (a soft
 * brush's half-transparent edge is kept), at any size: so they are picked at the mask's own size, as a
 * black-and-white picture that is then scaled, a pixel repainted where at least half of what it is
 * scaled from was (a fully transparent area keeps its border, neither grown nor shrunk). Before, the
 * alpha itself was scaled and cut at half: a half-transparent area, kept at the model's own size, was
 * repainted whole once scaled, which every photo larger than the model's size is.
 */
async function fitRepaint(input: InputImage, width: number, height: number): Promise<Buffer> {
  try {
    // 255 where alpha is 0 (threshold: 255 from 1 up, then negated). sharp applies threshold after resize
    // whatever the calls' order, hence a pass at the mask's own size (one byte a pixel, 16 MiB at most).
    const marked = sharp(input.bytes, DECODE).rotate().ensureAlpha().extractChannel(3).threshold(1, { grayscale: false }).negate().toColourspace('b-w');
    if (input.width === width && input.height === height) return await marked.raw().toBuffer();
    return await fitAfter(marked, width, height, (fitted) => fitted.threshold(128, { grayscale: false }).toColourspace('b-w'));
  } catch {
    throw damaged(input.param, input.format);
  }
}

/** An edit's picture and mask (255 where to repaint; none: everywhere) at the size its request runs at. */
export interface EditPicture {
  image: RgbImage;
  mask?: Uint8Array;
}

/**
 * The edit's picture and mask (where to repaint, see editMarks) at the size the request runs at. The
 * channels are split and the mask thresholded by libvips, off the event loop: a JavaScript loop over
 * every pixel held the server's one thread for a third of a second at 1792x1024. `cell`: the model's
 * VAE scale, the side of the pixel blocks its latent mask reads one pixel of (below).
 */
export async function fitEdit({ image, mask: marks }: EditSource, width: number, height: number, cell: number): Promise<EditPicture> {
  const fitted = { pixels: await fitColour(image, width, height), width, height };
  if (!marks) return { image: fitted };
  const mask = await fitRepaint(marks, width, height);
  const scaled = marks.width !== width || marks.height !== height;
  if (!mask.includes(255)) {
    const none = !marks.hasTransparentPixel;
    throw marksNothing(marks, none || !scaled ? 'it has no fully transparent pixel' : `scaled to ${width}x${height}, its fully transparent pixels are too few to mark any pixel`);
  }
  if (!marksACell(mask, width, height, cell)) {
    throw marksNothing(
      marks,
      `its transparent area is too thin: the model repaints the picture in ${cell}x${cell} blocks, each as the block's top-left pixel is marked (as diffusers does), and ${scaled ? `scaled to ${width}x${height}, ` : ''}no block's top-left pixel is transparent`,
      `, at least ${cell} pixels wide and tall`,
    );
  }
  return { image: fitted, mask };
}

/**
 * Whether `mask` repaints any latent pixel: the pipelines shrink it to the latent grid by its pixel at
 * each block's top-left corner (pipelines/denoise.ts latentMask, as diffusers' nearest-neighbour
 * interpolation), so transparent strokes that fall between those pixels repaint nothing.
 */
function marksACell(mask: Uint8Array, width: number, height: number, cell: number): boolean {
  for (let y = 0; y < height; y += cell) {
    for (let x = 0; x < width; x += cell) if (mask[y * width + x] === 255) return true;
  }
  return false;
}

/**
 * A mask that marks nothing to repaint, `why`: the edit would run in full and answer the picture
 * unchanged (a mask painted opaque, or exported with an alpha channel but no transparency; transparent
 * pixels too few to outlast scaling; or none where the model reads its mask), which reads as the
 * server ignoring the request.
 */
function marksNothing(marks: InputImage, why: string, wide = ''): ApiError {
  const what = marks.param === 'mask' ? 'the mask' : 'the image (its transparent pixels are its mask)';
  return ApiError.invalid(
    marks.param,
    'invalid_mask',
    `Invalid file '${marks.param}': ${what} marks nothing to edit: ${why}, so the picture would come back unchanged. Erase the area to redraw to full transparency${wide}${marks.param === 'mask' ? ', or send no mask to redraw the whole picture' : ''}.`,
  );
}
