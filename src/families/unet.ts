import { halvings, type VariantClues } from './family.js';

/** Rules the UNet families (SD 1.x/2.x, SDXL) share. */

/**
 * As diffusers computes it: the VAE's scale factor times the UNet's down-sampling (2^(down blocks -
 * 1)). A UNet halves the latent grid once per down block after the first and must double it back to
 * the same size to concatenate its skip connections; `fallback` is for exports without a config.json.
 */
export function unetSizeMultiple(vaeScale: number, denoiserConfig: Record<string, unknown>, fallback: number): number {
  const unet = halvings(denoiserConfig.down_block_types);
  return unet === undefined ? fallback : vaeScale * unet;
}

/** `sample_size` x the VAE's scale, when the UNet's config says. */
export function unetNativeSize(vaeScale: number, denoiserConfig: Record<string, unknown>): number | undefined {
  return typeof denoiserConfig.sample_size === 'number' && denoiserConfig.sample_size ? denoiserConfig.sample_size * vaeScale : undefined;
}

/**
 * Adversarially distilled for a step or few: its name says so, or its scheduler's trailing spacing,
 * unless a zero-terminal-SNR schedule (rescale_betas_zero_snr) comes with it: Lin et al. 2023 pair the
 * two for sampling at the usual step counts, so such an SD 2.1 or SDXL fine-tune wants its base's steps
 * and guidance, not one step without guidance. The turbo models' own configs do not rescale.
 */
export function isTurbo({ scheduler, modelIndex }: VariantClues): boolean {
  const name = String(modelIndex?._name_or_path ?? '').toLowerCase();
  return name.includes('turbo') || (scheduler.timestep_spacing === 'trailing' && scheduler.rescale_betas_zero_snr !== true);
}

/**
 * How a UNet became a latent consistency model (a few steps), if it did: 'distilled' when it takes the
 * guidance as an embedding (time_cond_proj_dim: LCM Dreamshaper, lcm-sdxl), run with the w it was
 * distilled with; 'lora' when its folder ships LCMScheduler for an ordinary UNet, an LCM-LoRA fused into
 * it, whose guidance is classifier-free and wants 1 (diffusers' LCM-LoRA guide: at most 2), where a
 * distilled model's w of 8 run as classifier-free guidance burns the picture at twice the work.
 */
export function latentConsistency({ scheduler, denoiserConfig }: VariantClues): 'distilled' | 'lora' | undefined {
  if (denoiserConfig.time_cond_proj_dim != null) return 'distilled';
  return scheduler._class_name === 'LCMScheduler' ? 'lora' : undefined;
}
