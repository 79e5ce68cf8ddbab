import sharp from 'sharp';
import { Rng } from '../runtime/random.js';
import { bufferView } from '../util/bytes.js';
import type { LatentShape, LoopPreview } from './denoise.js';
import type { Prediction } from './clean-estimate.js';
import type { OnDemand } from './on-demand.js';
import type { GenerateHooks, RgbImage } from './pipeline.js';
import type { VaeDecoder } from './vae.js';

/**
 * Cheap previews of latents, for streamed partial images: each latent pixel's colour as an affine map
 * of its channels, upscaled to the image size. A full VAE decode per partial image would cost as much
 * as the final decode (seconds at photo sizes); this costs a few milliseconds.
 *
 * The map is not a table of per-family constants: it is fitted once per model, by least squares, to
 * what the model's own VAE decoder makes of random latents (the mean colour of the pixels each latent
 * pixel becomes). A linear VAE (the reference models') is reproduced exactly; a real one approximately,
 * as the hand-made "latent to RGB" tables of other tools do.
 */

/** Latent pixels along a side of the probe the map is fitted on. */
const PROBE_SIDE = 16;

export class LatentPreview {
  private constructor(
    private readonly channels: number,
    /** Per output colour: the weight of each latent channel, then the bias. */
    private readonly rows: Float64Array[],
  ) {}

  static async fit(vae: VaeDecoder, channels: number, scale: number): Promise<LatentPreview> {
    const probe = new Rng(0).fillNormal(new Float32Array(channels * PROBE_SIDE * PROBE_SIDE));
    // Whole, without asking the memory plan's tiler: the probe is tiny, and the plan takes that question for a batch's decode beginning.
    const [image] = await vae.decode(probe.slice(), 1, channels, PROBE_SIDE, PROBE_SIDE, null);
    const samples = PROBE_SIDE * PROBE_SIDE;
    const inputs = Array.from({ length: samples }, (_, p) => {
      const row = new Float64Array(channels + 1);
      for (let c = 0; c < channels; c++) row[c] = probe[c * samples + p];
      row[channels] = 1;
      return row;
    });
    const colours = Array.from({ length: 3 }, (_, colour) => Float64Array.from({ length: samples }, (_, p) => blockMean(image, scale, p, colour)));
    return new LatentPreview(channels, colours.map((target) => leastSquares(inputs, target)));
  }

  /** It holds only its numbers (OnDemand releases what it loaded). */
  async release(): Promise<void> {}

  /** Item `item` of [batch, channels, height, width] latents as a width x height picture. */
  async render(latents: Float32Array, item: number, height: number, width: number, size: { width: number; height: number }): Promise<RgbImage> {
    const plane = height * width;
    const base = item * this.channels * plane;
    const pixels = new Uint8Array(plane * 3);
    for (let p = 0; p < plane; p++) {
      for (let colour = 0; colour < 3; colour++) {
        const row = this.rows[colour];
        let v = row[this.channels];
        for (let c = 0; c < this.channels; c++) v += row[c] * latents[base + c * plane + p];
        pixels[p * 3 + colour] = Math.min(255, Math.max(0, Math.round(v)));
      }
    }
    const resized = await sharp(bufferView(pixels), { raw: { width, height, channels: 3 } })
      .resize(size.width, size.height, { kernel: 'cubic' })
      .raw()
      .toBuffer();
    return { pixels: new Uint8Array(resized.buffer, resized.byteOffset, resized.length), width: size.width, height: size.height };
  }
}

/**
 * The loop's previews for a batch when its hooks want any: the predicted clean latents (laid out as
 * [batch, channels, height, width] by `unlayout`, for FLUX's packed ones) rendered at `size`, the batch's.
 */
export function previewLoop(
  hooks: GenerateHooks | undefined,
  previews: OnDemand<LatentPreview>,
  prediction: Prediction,
  size: { width: number; height: number },
  shape: LatentShape,
  unlayout: (clean: Float32Array) => Float32Array = (clean) => clean,
): LoopPreview | undefined {
  const onPreview = hooks?.onPreview;
  if (!onPreview) return undefined;
  return {
    prediction,
    async show(clean, step, total, items) {
      const map = await previews.get();
      const latents = unlayout(clean);
      const shown = await Promise.all(items.map(async (item) => ({ item, image: await map.render(latents, item, shape.height, shape.width, size) })));
      await onPreview(shown, step, total);
    },
  };
}

/** The mean of one colour over the scale x scale pixels that latent pixel `p` of the probe became. */
function blockMean(image: RgbImage, scale: number, p: number, colour: number): number {
  const [y0, x0] = [Math.floor(p / PROBE_SIDE) * scale, (p % PROBE_SIDE) * scale];
  let sum = 0;
  for (let y = y0; y < y0 + scale; y++) for (let x = x0; x < x0 + scale; x++) sum += image.pixels[(y * image.width + x) * 3 + colour];
  return sum / (scale * scale);
}

/** Weights w minimising |inputs w - target|^2 (normal equations, Gaussian elimination with pivoting). */
function leastSquares(inputs: Float64Array[], target: Float64Array): Float64Array {
  const n = inputs[0].length;
  // [A^T A | A^T y], with a tiny ridge so that a channel the decoder ignores cannot make it singular.
  const m = Array.from({ length: n }, (_, i) => {
    const row = new Float64Array(n + 1);
    for (let j = 0; j < n; j++) for (const x of inputs) row[j] += x[i] * x[j];
    row[i] += 1e-9;
    inputs.forEach((x, s) => (row[n] += x[i] * target[s]));
    return row;
  });
  for (let col = 0; col < n; col++) {
    const pivot = m.slice(col).reduce((best, row, k) => (Math.abs(row[col]) > Math.abs(m[best][col]) ? col + k : best), col);
    [m[col], m[pivot]] = [m[pivot], m[col]];
    for (let r = 0; r < n; r++) {
      if (r === col) continue;
      const f = m[r][col] / m[col][col];
      for (let k = col; k <= n; k++) m[r][k] -= f * m[col][k];
    }
  }
  return Float64Array.from({ length: n }, (_, i) => m[i][n] / m[i][i]);
}
