import type { BatchNoise } from '../runtime/random.js';
import type { GenerationBatch, RgbImage } from '../runtime/types.js';
import { strengthStart, type StrengthRule } from '../schedulers/index.js';
import type { Scheduler } from '../schedulers/scheduler.js';
import { cleanEstimate, type Prediction } from './clean-estimate.js';
import { GenerationCancelled, type GenerateHooks } from './pipeline.js';

/** Where the loop starts: its latents, the call they are at, and what inpainting keeps. */
export interface Start {
  latents: Float32Array;
  call: number;
  keep?: Kept;
}

/**
 * Inpainting's kept area, laid out like the latents: the input's clean latents, the noise that took
 * them to the start, and the mask (1 = repaint, 0 = keep).
 */
export interface Kept {
  original: Float32Array;
  noise: Float32Array;
  mask: Float32Array;
}

/** The latents' shape per item: channels x height x width of the latent grid. */
export interface LatentShape {
  channels: number;
  height: number;
  width: number;
}

/** How a family shows the loop's predicted clean latents (in the loop's own layout) as previews. */
export interface LoopPreview {
  prediction: Prediction;
  /** Shows items `items` of the batch (by number) only: the others asked for no preview. */
  show(clean: Float32Array, step: number, total: number, items: readonly number[]): Promise<void>;
}

/**
 * The denoising loop every family shares: the scheduler decides the timesteps and the update, the
 * family's `predict` wraps the model call (guidance, extra inputs, packing). Image-to-image starts at
 * a later call (see startingLatents); inpainting puts the kept area back after every step, noised to
 * the level of the next call (clean after the last), as diffusers does for UNets without mask inputs.
 * After a step the hooks ask for a preview of, the predicted clean latents go to `preview`.
 */
export async function denoise(
  scheduler: Scheduler,
  start: Start,
  noise: BatchNoise,
  predict: (modelInput: Float32Array, timestep: number) => Promise<Float32Array>,
  hooks: GenerateHooks = {},
  preview?: LoopPreview,
): Promise<Float32Array> {
  let x = start.latents;
  const calls = scheduler.timesteps.length;
  const total = calls - start.call;
  for (let i = start.call; i < calls; i++) {
    if (hooks.shouldStop?.()) throw new GenerationCancelled();
    const output = await predict(scheduler.scaleModelInput(x, i), scheduler.timesteps[i]);
    const step = i + 1 - start.call;
    const previewed = preview && step < total ? (hooks.previewsAt?.(step, total) ?? []) : [];
    if (preview && previewed.length) {
      const clean = cleanEstimate(preview.prediction, scheduler, i, x, output);
      await preview.show(start.keep ? blend(clean, start.keep) : clean, step, total, previewed);
    }
    x = scheduler.step(output, i, x, noise);
    if (start.keep) x = putBack(scheduler, x, start.keep, i + 1);
    hooks.onStep?.(step, total);
  }
  return x;
}

/** `x` where the mask repaints, `original` where it keeps (in place). */
function blend(x: Float32Array, { original, mask }: Kept): Float32Array {
  for (let i = 0; i < x.length; i++) x[i] = mask[i] * x[i] + (1 - mask[i]) * original[i];
  return x;
}

/** The kept area put back, noised to the level of call `next` (clean after the last). */
function putBack(scheduler: Scheduler, x: Float32Array, keep: Kept, next: number): Float32Array {
  const original = next < scheduler.timesteps.length ? scheduler.addNoise(keep.original, keep.noise, next) : keep.original;
  return blend(x, { ...keep, original });
}

/** The same start with every array laid out anew (FLUX packs its latents into patches). */
export function relayout(start: Start, layout: (latents: Float32Array) => Float32Array): Start {
  const keep = start.keep && { original: layout(start.keep.original), noise: layout(start.keep.noise), mask: layout(start.keep.mask) };
  return { latents: layout(start.latents), call: start.call, keep };
}

/**
 * A picture for the VAE encoder: where `blank` is 255 (pixels to repaint) it reads 0, the middle of
 * its [-1, 1], as diffusers' inpainting pipelines multiply the masked area of the picture by 0.
 */
export interface PictureToEncode extends RgbImage {
  blank?: Uint8Array;
}

/** What startingLatents needs of the VAE encoder, bound to the batch's generators. */
export interface PictureEncoder {
  /**
   * [batch, C, h, w] latents of the pictures, in item order (a sampled posterior draws from the item's
   * generator). An item without a picture is not encoded: its latents are zeros and its generator draws nothing.
   */
  encode(images: readonly (PictureToEncode | undefined)[]): Promise<Float32Array>;
  /** Makes the draws that encoding the marked items' pictures into `perItem` latents each would, without encoding them. */
  drawWithoutEncoding(perItem: number, drawing: readonly boolean[]): Promise<void>;
}

/** How a pipeline starts from a picture, as its diffusers counterpart does. */
export interface StartRules {
  /** How it reads strength (schedulers/strength.ts; models/layout.ts strengthRule). */
  rule: StrengthRule;
  /**
   * Its UNet takes the mask and the masked picture as input (9 channels): at strength 1 a masked
   * item's picture itself is then never encoded, so its starting noise is its generator's first draw.
   */
  inpaintingUnet?: boolean;
}

/**
 * Where a generation starts: text-to-image at call 0 from each item's own Gaussian noise (or the noise
 * it was given) times the scheduler's starting sigma; image-to-image (`batch.strength`) at the call
 * strength leaves, from the items' encoded pictures noised to that call's level, as diffusers' img2img
 * pipelines do; inpainting (items with a `mask`) the same, keeping the unmasked area, except that at
 * strength 1 Stable Diffusion's inpainting pipelines start from pure noise (times the starting sigma)
 * rather than from the picture noised to the first step, where some of it would show through. The
 * picture is encoded before the noise is drawn (an encoder that samples its posterior draws from the
 * same generators), as diffusers does; so is, after it, the masked picture that diffusers' inpainting
 * pipelines encode for every denoiser: one that does not take it (not an inpainting UNet) has only the
 * draws made, so that the noise of later steps (ancestral and consistency schedulers) is diffusers'.
 * Each item is decided on its own (its mask, its draws): the batcher merges edits with and without a
 * mask that share the rest, and an item's seed must give the same picture in any batch.
 */
export async function startingLatents(
  batch: Pick<GenerationBatch, 'steps' | 'strength' | 'items' | 'width' | 'height'>,
  scheduler: Scheduler,
  noise: BatchNoise,
  shape: LatentShape,
  encoder: PictureEncoder,
  { rule, inpaintingUnet = false }: StartRules,
): Promise<Start> {
  const perItem = shape.channels * shape.height * shape.width;
  if (batch.strength === undefined) return { latents: initialLatents(noise, perItem, scheduler.initNoiseSigma), call: 0 };
  const images = batch.items.map((item, i) => {
    if (!item.image) throw new RangeError(`image-to-image item ${i} has no image`);
    if (item.image.width !== batch.width || item.image.height !== batch.height) {
      throw new RangeError(`image-to-image item ${i} is ${item.image.width}x${item.image.height}; the batch makes ${batch.width}x${batch.height}`);
    }
    return item.image;
  });
  const call = strengthStart(batch.steps, batch.strength, rule);
  const masked = batch.items.map((item) => item.mask !== undefined);
  const fromNoise = masked.map((m) => m && rule !== 'flow' && batch.strength === 1);
  // An inpainting UNet's pipeline starting from pure noise never encodes the picture (nor draws its posterior).
  const toEncode = images.map((image, b) => (fromNoise[b] && inpaintingUnet ? undefined : image));
  const original = toEncode.some(Boolean) ? await encoder.encode(toEncode) : new Float32Array(perItem * images.length);
  const drawn = noise.initial(perItem);
  const latents = scheduler.addNoise(original, drawn, call);
  fromNoise.forEach((pure, b) => {
    if (pure) latents.set(scaled(drawn.slice(b * perItem, (b + 1) * perItem), scheduler.initNoiseSigma), b * perItem);
  });
  if (!masked.some(Boolean)) return { latents, call };
  if (!inpaintingUnet) await encoder.drawWithoutEncoding(perItem, masked);
  const mask = new Float32Array(perItem * batch.items.length);
  batch.items.forEach((item, b) => mask.set(latentMask(item.mask, batch, shape, b), b * perItem));
  return { latents, call, keep: { original, noise: drawn, mask } };
}

/**
 * An item's mask (image pixels, 255 = repaint; none = repaint everything) on the latent grid, the same
 * for every channel. As diffusers' inpainting pipelines shrink their binarised mask to the latents
 * (torch's interpolate, mode 'nearest'), a latent pixel takes the value of the first image pixel it
 * covers, the top left of its block.
 */
export function latentMask(mask: Uint8Array | undefined, batch: Pick<GenerationBatch, 'width' | 'height'>, shape: LatentShape, item: number): Float32Array {
  const out = new Float32Array(shape.channels * shape.height * shape.width).fill(1);
  if (!mask) return out;
  if (mask.length !== batch.width * batch.height) throw new RangeError(`the mask of item ${item} has ${mask.length} pixels; the batch makes ${batch.width}x${batch.height}`);
  const [sy, sx] = [batch.height / shape.height, batch.width / shape.width];
  const plane = shape.height * shape.width;
  for (let y = 0; y < shape.height; y++) {
    for (let x = 0; x < shape.width; x++) {
      // floor(index x scale), as torch's nearest picks its source pixel; 255 or 0 here, so >= 128 is diffusers' >= 0.5.
      const repaint = mask[Math.floor(y * sy) * batch.width + Math.floor(x * sx)] >= 128 ? 1 : 0;
      for (let c = 0; c < shape.channels; c++) out[c * plane + y * shape.width + x] = repaint;
    }
  }
  return out;
}

/** Initial latents: each item's own Gaussian noise (or the noise it was given), times the scheduler's starting sigma. */
function initialLatents(noise: BatchNoise, perItem: number, initNoiseSigma: number): Float32Array {
  return scaled(noise.initial(perItem), initNoiseSigma);
}

/** `x` times `factor`, in place. */
function scaled(x: Float32Array, factor: number): Float32Array {
  for (let i = 0; i < x.length; i++) x[i] *= factor;
  return x;
}
