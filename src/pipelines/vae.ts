import type { OnnxModel } from '../runtime/onnx-model.js';
import type { BatchNoise } from '../runtime/random.js';
import { everyItemMade } from '../runtime/types.js';
import type { PictureEncoder, PictureToEncode } from './denoise.js';
import type { OnDemand } from './on-demand.js';
import type { RgbImage } from './pipeline.js';

/** Tiled decoding: square tiles of `tile` latent pixels a side, each overlapping its neighbours by `overlap`. */
export interface VaeTiling {
  tile: number;
  overlap: number;
}

/** How an image of this latent size is decoded: tiled, or whole (undefined). See MemoryPlan.vaeTiler. */
export type VaeTiler = (latentWidth: number, latentHeight: number) => VaeTiling | undefined;

/**
 * The VAE decoder: undoes the latent scaling (z / scaling_factor + shift_factor), decodes one image at
 * a time to bound memory at large sizes, and maps [-1, 1] to 8-bit RGB. Where the whole decode would
 * not fit memory (its mid-block attention grows with the square of the pixels), `tiler` makes it
 * decode in overlapping tiles instead (see decodeTiled).
 */
export class VaeDecoder {
  constructor(
    private readonly model: OnnxModel,
    private readonly scalingFactor: number,
    private readonly shiftFactor: number,
    private readonly tiler?: VaeTiler,
  ) {}

  release(): Promise<void> {
    return this.model.release();
  }

  /**
   * `tiling`: decode in tiles; by default the tiler's choice (it is asked as a batch's decode begins,
   * see MemoryPlan.vaeTiler); null decodes whole without asking.
   */
  async decode(
    latents: Float32Array,
    batch: number,
    channels: number,
    latentHeight: number,
    latentWidth: number,
    tiling: VaeTiling | null | undefined = this.tiler?.(latentWidth, latentHeight),
  ): Promise<RgbImage[]> {
    // The tiler's choice made here (no tiling: null), or the one below would ask it again.
    return everyItemMade(await this.decodeWanted(latents, batch, channels, latentHeight, latentWidth, undefined, tiling ?? null));
  }

  /** As decode, but only the items `wanted` (see GenerateHooks.wanted; all without it) still says yes to as each one's turn comes: none for the others. */
  async decodeWanted(
    latents: Float32Array,
    batch: number,
    channels: number,
    latentHeight: number,
    latentWidth: number,
    wanted: ((item: number) => boolean) | undefined,
    tiling: VaeTiling | null | undefined = this.tiler?.(latentWidth, latentHeight),
  ): Promise<(RgbImage | undefined)[]> {
    const per = channels * latentHeight * latentWidth;
    const images: (RgbImage | undefined)[] = [];
    for (let b = 0; b < batch; b++) {
      if (wanted && !wanted(b)) {
        images.push(undefined);
        continue;
      }
      const z = latents.slice(b * per, (b + 1) * per);
      if (!allFinite(z)) throw new NonFiniteOutputError('denoiser');
      for (let i = 0; i < z.length; i++) z[i] = z[i] / this.scalingFactor + this.shiftFactor;
      const whole = !tiling || (latentHeight <= tiling.tile && latentWidth <= tiling.tile);
      const { data, height, width } = whole ? await this.run(z, channels, latentHeight, latentWidth) : await this.decodeTiled(z, channels, latentHeight, latentWidth, tiling);
      if (!allFinite(data)) throw new NonFiniteOutputError('vae_decoder');
      images.push(toRgb(data, height, width));
    }
    return images;
  }

  /** One decoder call: [1, C, h, w] latents to [1, 3, H, W] in [-1, 1]. */
  private async run(z: Float32Array, channels: number, latentHeight: number, latentWidth: number): Promise<{ data: Float32Array; height: number; width: number }> {
    const { sample } = await this.model.run({ latent_sample: { data: z, dims: [1, channels, latentHeight, latentWidth] } }, ['sample']);
    return { data: sample.data, height: sample.dims[2], width: sample.dims[3] };
  }

  /**
   * Decodes overlapping latent tiles one at a time and blends them: across each overlap a tile's weight
   * falls linearly to zero as its neighbour's rises, so the two decodes cross-fade and no seam is left
   * where a tile's edge (decoded without what lies beyond it) would show. Memory is that of one tile's
   * decode plus the full-size output.
   */
  private async decodeTiled(z: Float32Array, channels: number, latentHeight: number, latentWidth: number, { tile, overlap }: VaeTiling): Promise<{ data: Float32Array; height: number; width: number }> {
    const rows = tileSpans(latentHeight, tile, overlap);
    const cols = tileSpans(latentWidth, tile, overlap);
    let scale = 0;
    let sum = new Float32Array(0);
    let weights = new Float32Array(0);
    for (const row of rows) {
      for (const col of cols) {
        const part = await this.run(crop(z, channels, latentHeight, latentWidth, row, col), channels, row.size, col.size);
        if (!scale) {
          scale = part.height / row.size;
          sum = new Float32Array(3 * latentHeight * scale * latentWidth * scale);
          weights = new Float32Array(latentHeight * scale * latentWidth * scale);
        }
        const wy = ramp(row, scale);
        const wx = ramp(col, scale);
        const [height, width] = [latentHeight * scale, latentWidth * scale];
        for (let c = 0; c < 3; c++) {
          for (let y = 0; y < part.height; y++) {
            const from = (c * part.height + y) * part.width;
            const to = (c * height + row.start * scale + y) * width + col.start * scale;
            for (let x = 0; x < part.width; x++) sum[to + x] += part.data[from + x] * wy[y] * wx[x];
          }
        }
        for (let y = 0; y < part.height; y++) {
          const to = (row.start * scale + y) * width + col.start * scale;
          for (let x = 0; x < part.width; x++) weights[to + x] += wy[y] * wx[x];
        }
      }
    }
    const plane = weights.length;
    for (let c = 0; c < 3; c++) for (let i = 0; i < plane; i++) sum[c * plane + i] /= weights[i];
    return { data: sum, height: latentHeight * scale, width: latentWidth * scale };
  }
}

/**
 * A model's output held NaN or infinite values, which toRgb would have drawn as a black (or blank)
 * picture without a word: an overflow, almost always of fp16 arithmetic (SDXL's VAE is known to
 * overflow in fp16; onnxruntime's GPU providers compute fp16 graphs in fp16, where the CPU one
 * computes many operators in fp32). `stage`: whose output it was; the final latents are checked before
 * the decoder runs, so a decoder is blamed only for what it made of finite latents. Crosses the worker's
 * process boundary by name (service/failures.ts).
 */
export class NonFiniteOutputError extends Error {
  constructor(readonly stage: 'denoiser' | 'vae_decoder') {
    super(
      stage === 'denoiser'
        ? "its denoiser's latents held NaN or infinite values after the last step, so the picture would have been black. " +
            "This is an overflow: most often an fp16 export computing in fp16 on a GPU, or a guidance_scale far above the model's own. " +
            'Try a lower guidance_scale, or an fp32 export of the model.'
        : "its VAE decoder turned finite latents into NaN or infinite values, so the picture would have been black. " +
            "This is an fp16 overflow in the VAE decoder (SDXL's is known to overflow in fp16): install the model with an fp32 VAE decoder, " +
            "or with an fp16 one made not to overflow (madebyollin/sdxl-vae-fp16-fix for SDXL).",
    );
    this.name = 'NonFiniteOutputError';
  }
}

/** Whether every value is finite: x - x is 0 for every finite x and NaN for NaN and the infinities (about 4 ms for a 1024x1024 image's 3M values). */
function allFinite(values: Float32Array): boolean {
  for (let i = 0; i < values.length; i++) {
    const x = values[i];
    if (x - x !== 0) return false;
  }
  return true;
}

/**
 * [1, 3, H, W] in [-1, 1] -> interleaved 8-bit RGB: round(clamp(x / 2 + 0.5) x 255), one pass writing
 * each pixel's three bytes in order. floor(v + 0.5) is Math.round for v >= 0, and comparisons replace
 * Math.min/max: the same bytes as the per-channel version with Math calls, in about a third of its time
 * (the channels written out rather than looped over save a further sixth).
 */
export function toRgb(chw: Float32Array, height: number, width: number): RgbImage {
  const plane = height * width;
  const pixels = new Uint8Array(plane * 3);
  const byte = (x: number) => {
    const v = x / 2 + 0.5;
    return v <= 0 ? 0 : v >= 1 ? 255 : Math.floor(v * 255 + 0.5);
  };
  for (let i = 0, o = 0; i < plane; i++, o += 3) {
    pixels[o] = byte(chw[i]);
    pixels[o + 1] = byte(chw[plane + i]);
    pixels[o + 2] = byte(chw[2 * plane + i]);
  }
  return { pixels, width, height };
}

/** One tile's extent along an axis (latent pixels) and how far it overlaps the tiles before and after it. */
interface Span {
  start: number;
  size: number;
  before: number;
  after: number;
}

/**
 * Tiles along an axis of `length`: `tile` long, each starting `tile - overlap` after the last, the last
 * one moved back to end at the edge (so it may overlap its neighbour by more).
 */
export function tileSpans(length: number, tile: number, overlap: number): Span[] {
  if (length <= tile) return [{ start: 0, size: length, before: 0, after: 0 }];
  if (overlap >= tile) throw new RangeError(`a tile's overlap (${overlap}) must be less than the tile (${tile})`);
  const starts: number[] = [];
  for (let start = 0; start + tile < length; start += tile - overlap) starts.push(start);
  starts.push(length - tile);
  return starts.map((start, i) => ({
    start,
    size: tile,
    before: i > 0 ? starts[i - 1] + tile - start : 0,
    after: i < starts.length - 1 ? start + tile - starts[i + 1] : 0,
  }));
}

/** A tile's blending weight along one axis, per output pixel: rising across the overlap before it, falling across the one after. */
function ramp({ size, before, after }: Span, scale: number): Float32Array {
  const n = size * scale;
  const weights = new Float32Array(n).fill(1);
  for (let p = 0; p < before * scale; p++) weights[p] = (p + 0.5) / (before * scale);
  for (let p = 0; p < after * scale; p++) weights[n - 1 - p] = Math.min(weights[n - 1 - p], (p + 0.5) / (after * scale));
  return weights;
}

/** The [C, rows, cols] block of a [C, h, w] latent. */
function crop(z: Float32Array, channels: number, height: number, width: number, rows: Span, cols: Span): Float32Array {
  const out = new Float32Array(channels * rows.size * cols.size);
  for (let c = 0; c < channels; c++) {
    for (let y = 0; y < rows.size; y++) {
      const from = (c * height + rows.start + y) * width + cols.start;
      out.set(z.subarray(from, from + cols.size), (c * rows.size + y) * cols.size);
    }
  }
  return out;
}

/**
 * The VAE encoder, for image-to-image: 8-bit RGB to [-1, 1], encoded one image at a time, and scaled
 * into the denoiser's latent space ((z - shift_factor) x scaling_factor). Optimum's encoders output the
 * posterior's mean and log-variance (`latent_parameters`); as diffusers' img2img pipelines do, a latent
 * is sampled from it with the item's own generator. Legacy exports output the latent itself.
 */
export class VaeEncoder {
  private readonly output: string;

  constructor(
    private readonly model: OnnxModel,
    private readonly scalingFactor: number,
    private readonly shiftFactor: number,
    /** Told when a batch's pictures are encoded (the memory plan measures the denoising from there). */
    private readonly onEncoded: () => void = () => undefined,
  ) {
    this.output = model.outputNames.includes('latent_parameters') ? 'latent_parameters' : 'latent_sample';
  }

  release(): Promise<void> {
    return this.model.release();
  }

  /** [batch, C, h, w] latents of the images, in item order; an item without one gets zeros and draws nothing (PictureEncoder.encode). */
  async encode(images: readonly (PictureToEncode | undefined)[], noise: BatchNoise): Promise<Float32Array> {
    const parts: (Float32Array | undefined)[] = [];
    for (const image of images) {
      if (!image) {
        parts.push(undefined);
        continue;
      }
      const sample = { data: toSigned(image), dims: [1, 3, image.height, image.width] };
      const { [this.output]: out } = await this.model.run({ sample }, [this.output]);
      parts.push(out.data);
    }
    const encoded = parts.find((part) => part !== undefined);
    if (!encoded) throw new RangeError('no picture to encode');
    const per = encoded.length / (this.output === 'latent_parameters' ? 2 : 1);
    // One draw per item, each from its own generator: diffusers samples every item's posterior first.
    const eps = this.drawsFor(noise, per, parts.map((part) => part !== undefined));
    const latents = new Float32Array(per * images.length);
    parts.forEach((part, b) => {
      if (!part) return;
      for (let i = 0; i < per; i++) {
        let z = part[i];
        if (eps) z += Math.exp(0.5 * Math.min(20, Math.max(-30, part[per + i]))) * eps[b * per + i];
        latents[b * per + i] = (z - this.shiftFactor) * this.scalingFactor;
      }
    });
    this.onEncoded();
    return latents;
  }

  /** The draws sampling the marked items' posteriors of `perItem` latents makes (none when the encoder outputs the latent itself). */
  drawsFor(noise: BatchNoise, perItem: number, drawing: readonly boolean[]): Float32Array | undefined {
    return this.output === 'latent_parameters' ? noise.randn(perItem, drawing) : undefined;
  }
}

/**
 * Interleaved 8-bit RGB -> [1, 3, H, W] in [-1, 1] as diffusers' VaeImageProcessor makes it, each
 * operation rounded to float32 as torch's are: 2 x (p / 255) - 1 (p / 127.5 - 1 in double precision
 * differs in the last bit for half the bytes). Pixels `blank` marks (>= 128) are 0.
 */
function toSigned({ pixels, width, height, blank }: PictureToEncode): Float32Array {
  const plane = width * height;
  const out = new Float32Array(plane * 3);
  for (let i = 0; i < plane; i++) {
    if (blank && blank[i] >= 128) continue;
    for (let c = 0; c < 3; c++) out[c * plane + i] = 2 * Math.fround(pixels[i * 3 + c] / 255) - 1;
  }
  return out;
}

/** The encoder as startingLatents takes it: loaded when first used, drawing from the batch's generators. */
export function pictureEncoder(encoder: OnDemand<VaeEncoder>, noise: BatchNoise): PictureEncoder {
  return {
    encode: async (images) => (await encoder.get()).encode(images, noise),
    drawWithoutEncoding: async (perItem, drawing) => void (await encoder.get()).drawsFor(noise, perItem, drawing),
  };
}
