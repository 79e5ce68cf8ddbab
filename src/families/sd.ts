import { defineFamily } from './family.js';
import { isTurbo, latentConsistency, unetNativeSize, unetSizeMultiple } from './unet.js';

/** Stable Diffusion 1.x and 2.x, with their distilled offspring (SD-Turbo, LCM): one CLIP encoder and a UNet. */
export const sd = defineFamily({
  name: 'sd',
  denoiserFolder: 'unet',
  recognise: (folder) => !folder.components.has('text_encoder_2'),
  requires: [],
  variantOf(clues) {
    const { scheduler, denoiserConfig } = clues;
    const lcm = latentConsistency(clues);
    if (lcm) return lcm === 'distilled' ? 'lcm' : 'lcm-lora';
    if (isTurbo(clues)) return 'sd-turbo';
    if (scheduler.prediction_type === 'v_prediction' || denoiserConfig.cross_attention_dim === 1024) return 'sd2';
    return 'sd15';
  },
  variants: {
    sd15: { nativeSize: 512, steps: { low: 15, standard: 25, hd: 50 }, guidanceScale: { vivid: 7.5, natural: 5 }, maxBatch: 4 },
    sd2: { nativeSize: 768, steps: { low: 15, standard: 25, hd: 50 }, guidanceScale: { vivid: 7.5, natural: 5 }, maxBatch: 2 },
    // One step is as few as a turbo model takes: its low is its standard.
    'sd-turbo': { nativeSize: 512, steps: { low: 1, standard: 1, hd: 4 }, guidanceScale: { vivid: 0, natural: 0 }, maxBatch: 4 },
    // LCM's guidance is the w it was distilled with (diffusers' default 8.5), not classifier-free guidance.
    lcm: { nativeSize: 512, steps: { low: 2, standard: 4, hd: 8 }, guidanceScale: { vivid: 8.5, natural: 6 }, maxBatch: 4 },
    // An LCM-LoRA fused into an SD UNet: guidance 1 runs no classifier-free batch (see latentConsistency).
    'lcm-lora': { nativeSize: 512, steps: { low: 2, standard: 4, hd: 8 }, guidanceScale: { vivid: 1, natural: 1 }, maxBatch: 4 },
  },
  // Without a config: 8 (the VAE) x 2^3 (four down blocks).
  sizeMultiple: (vaeScale, config) => unetSizeMultiple(vaeScale, config, 64),
  nativeSize: unetNativeSize,
  vae: { scalingFactor: 0.18215, shiftFactor: 0 },
  schedulerKind: 'vp',
  capabilities: ['text-to-image', 'image-to-image', 'inpainting', 'previews'],
  pipeline: 'stable-diffusion',
});
