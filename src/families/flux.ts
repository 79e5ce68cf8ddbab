import { defineFamily } from './family.js';

const TRANSFORMER_CLASS = 'FluxTransformer2DModel';

/** FLUX.1 schnell and dev: CLIP and T5 encoders and a rectified-flow transformer over 2x2 latent patches. */
export const flux = defineFamily({
  name: 'flux',
  denoiserFolder: 'transformer',
  // SD3 keeps its transformer in the same folder: its class (SD3Transformer2DModel) and third text
  // encoder tell it apart, so it is refused as unknown rather than run as FLUX.
  recognise: (folder) =>
    !folder.components.has('text_encoder_3') &&
    (folder.denoiserClass ?? TRANSFORMER_CLASS) === TRANSFORMER_CLASS &&
    (folder.pipelineClass === undefined || folder.pipelineClass.startsWith('Flux')),
  requires: [{ component: 'text_encoder_2', why: 'FLUX needs its T5 encoder' }],
  variantOf: ({ scheduler, denoiserConfig }) =>
    denoiserConfig.guidance_embeds === true || scheduler.use_dynamic_shifting === true ? 'flux-dev' : 'flux-schnell',
  variants: {
    'flux-schnell': { nativeSize: 1024, steps: { low: 2, standard: 4, hd: 8 }, guidanceScale: { vivid: 0, natural: 0 }, maxBatch: 1, takesGuidance: false },
    // FLUX-dev's guidance is an embedded distilled value; 3.5 is its reference setting.
    'flux-dev': { nativeSize: 1024, steps: { low: 20, standard: 28, hd: 50 }, guidanceScale: { vivid: 3.5, natural: 2.5 }, maxBatch: 1 },
  },
  // The VAE's scale x 2 for the 2x2 packing x the transformer's own patch size.
  sizeMultiple: (vaeScale, config) => vaeScale * 2 * (typeof config.patch_size === 'number' ? config.patch_size : 1),
  // Trained at many sizes: its sample_size is not a resolution, so its variant's applies.
  nativeSize: () => undefined,
  vae: { scalingFactor: 0.3611, shiftFactor: 0.1159 },
  schedulerKind: 'flow',
  capabilities: ['text-to-image', 'image-to-image', 'inpainting', 'previews'],
  pipeline: 'flux',
  // T5 sequence length: schnell was distilled at 256 tokens, dev at 512.
  secondEncoderLength: { 'flux-schnell': 256, 'flux-dev': 512 },
});
