import type { ModelLayout } from '../models/layout.js';
import { familyEntry } from '../families/index.js';
import { takesInpaintingInput } from './inpainting-input.js';

/** FLUX's VAE latents, which its transformer takes packed into 2x2 patches. */
export const FLUX_LATENT_CHANNELS = 16;

/** SD and SDXL VAE latents (an inpainting UNet's 9 input channels are these and its mask's and picture's). */
const SD_LATENT_CHANNELS = 4;

/**
 * The channels of a model's starting noise, [1, C, H/8, W/8]: what its pipeline draws, and what a
 * golden file's latents must hold (cli/golden.ts checks them before a case runs).
 */
export function latentChannels(layout: Pick<ModelLayout, 'family' | 'denoiserConfig'>): number {
  if (familyEntry(layout.family).pipeline === 'flux') return FLUX_LATENT_CHANNELS;
  const inChannels = layout.denoiserConfig.in_channels;
  return typeof inChannels === 'number' && !takesInpaintingInput(layout) ? inChannels : SD_LATENT_CHANNELS;
}
