import type { GenerationBatch, RgbImage } from '../runtime/types.js';
import type { ModelLayout } from '../models/layout.js';
import { latentMask, type LatentShape, type PictureToEncode } from './denoise.js';

/**
 * What inpainting UNets (in_channels 9, e.g. stable-diffusion-inpainting) take beside the noisy
 * latents, as diffusers' StableDiffusionInpaintPipeline prepares it: the mask on the latent grid
 * (1 = repaint) and the latents of the picture with its repainted area blanked. Such a model keeps the
 * unmasked area itself, so the loop does not put it back. A text-to-image request on one is an
 * inpainting of a blank picture masked everywhere.
 */

/** Channels an inpainting UNet takes beyond the latents: the mask, then the masked picture's latents. */
export const INPAINTING_EXTRA_CHANNELS = 5;

/** Whether the model's UNet is an inpainting UNet: its config's in_channels are the 4 latent ones and the extra ones (none said: a plain UNet). */
export const takesInpaintingInput = (layout: Pick<ModelLayout, 'denoiserConfig'>): boolean => layout.denoiserConfig.in_channels === 4 + INPAINTING_EXTRA_CHANNELS;

/**
 * Whether the model runs its VAE encoder for every item, text-to-image included (a blank picture): an
 * inpainting UNet with an encoder. The memory plan counts that encode as it does image-to-image's.
 */
export const encodesEveryItem = (layout: Pick<ModelLayout, 'denoiserConfig' | 'vaeEncoder'>): boolean => takesInpaintingInput(layout) && layout.vaeEncoder !== undefined;

/**
 * [items, 5, h, w]: each item's latent mask and masked picture latents. `encode` is the VAE encoder
 * (undefined when the export has none: the masked latents are then zeros, as a blank picture's nearly are).
 */
export async function inpaintingChannels(
  batch: Pick<GenerationBatch, 'items' | 'width' | 'height'>,
  shape: LatentShape,
  encode: ((images: PictureToEncode[]) => Promise<Float32Array>) | undefined,
): Promise<Float32Array> {
  const plane = shape.height * shape.width;
  const latentPerItem = shape.channels * plane;
  const masks = batch.items.map((item, b) => latentMask(item.image ? item.mask : undefined, batch, { ...shape, channels: 1 }, b));
  const pictures = batch.items.map((item) => masked(item.image, item.image ? item.mask : undefined, batch));
  const latents = encode ? await encode(pictures) : new Float32Array(latentPerItem * batch.items.length);
  const out = new Float32Array(batch.items.length * INPAINTING_EXTRA_CHANNELS * plane);
  masks.forEach((mask, b) => {
    out.set(mask, b * INPAINTING_EXTRA_CHANNELS * plane);
    out.set(latents.subarray(b * latentPerItem, (b + 1) * latentPerItem), (b * INPAINTING_EXTRA_CHANNELS + 1) * plane);
  });
  return out;
}

/** The picture with the pixels to repaint blanked (all of them without a picture or a mask): the encoder reads them as 0. */
function masked(image: RgbImage | undefined, mask: Uint8Array | undefined, { width, height }: Pick<GenerationBatch, 'width' | 'height'>): PictureToEncode {
  if (image && mask) return { ...image, blank: mask };
  return { pixels: image?.pixels ?? new Uint8Array(width * height * 3), width, height, blank: new Uint8Array(width * height).fill(255) };
}
