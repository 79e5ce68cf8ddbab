import { defineFamily } from './family.js';
import { isTurbo, latentConsistency, unetNativeSize, unetSizeMultiple } from './unet.js';

/** SDXL, SDXL-Turbo and SDXL's latent consistency models: two CLIP encoders (the second with a projection) and a UNet. */
export const sdxl = defineFamily({
  name: 'sdxl',
  denoiserFolder: 'unet',
  recognise: (folder) => folder.components.has('text_encoder_2'),
  requires: [],
  variantOf(clues) {
    const lcm = latentConsistency(clues);
    if (lcm) return lcm === 'distilled' ? 'sdxl-lcm' : 'sdxl-lcm-lora';
    return isTurbo(clues) ? 'sdxl-turbo' : 'sdxl';
  },
  variants: {
    sdxl: { nativeSize: 1024, steps: { low: 20, standard: 30, hd: 50 }, guidanceScale: { vivid: 7, natural: 5 }, maxBatch: 1 },
    'sdxl-turbo': { nativeSize: 512, steps: { low: 1, standard: 1, hd: 4 }, guidanceScale: { vivid: 0, natural: 0 }, maxBatch: 4 },
    // lcm-sdxl's card runs 4 steps at w 8; an LCM-LoRA fused into SDXL's UNet runs without a classifier-free batch (see latentConsistency).
    'sdxl-lcm': { nativeSize: 1024, steps: { low: 2, standard: 4, hd: 8 }, guidanceScale: { vivid: 8, natural: 6 }, maxBatch: 1 },
    'sdxl-lcm-lora': { nativeSize: 1024, steps: { low: 2, standard: 4, hd: 8 }, guidanceScale: { vivid: 1, natural: 1 }, maxBatch: 1 },
  },
  // Without a config: 8 (the VAE) x 2^2 (three down blocks).
  sizeMultiple: (vaeScale, config) => unetSizeMultiple(vaeScale, config, 32),
  nativeSize: unetNativeSize,
  vae: { scalingFactor: 0.13025, shiftFactor: 0 },
  schedulerKind: 'vp',
  capabilities: ['text-to-image', 'image-to-image', 'inpainting', 'previews'],
  pipeline: 'stable-diffusion',
});
