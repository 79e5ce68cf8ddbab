import { ort } from '../../src/runtime/onnxruntime.js';
import type { GraphSource } from '../../src/runtime/graph-rewrite.js';
import { createSession } from '../../src/runtime/providers.js';

/**
 * Fixed, varied feeds for the real exports' graphs (latents of `side` x `side`, text states 32 wide as in
 * ../shared/data/real-exports), for comparing two sessions of one graph: the UNet with guidance's batch
 * of 2, the VAE decoder with one latent (4 channels, FLUX's 16), FLUX's transformer with one image.
 */
const wave = (length: number, f: (i: number) => number) => Float32Array.from({ length }, (_, i) => f(i));

export const EXPORT_FEEDS = {
  unet: (side: number): Record<string, ort.Tensor> => ({
    sample: new ort.Tensor('float32', wave(2 * 4 * side * side, Math.sin), [2, 4, side, side]),
    timestep: new ort.Tensor('float32', new Float32Array([500]), []),
    encoder_hidden_states: new ort.Tensor('float32', wave(2 * 77 * 32, (i) => Math.cos(i) / 10), [2, 77, 32]),
  }),
  vae_decoder: (side: number, channels = 4): Record<string, ort.Tensor> => ({ latent_sample: new ort.Tensor('float32', wave(channels * side * side, Math.sin), [1, channels, side, side]) }),
  /** FLUX's, one image: its latents packed into 2x2 patches of 16 channels, 256 T5 tokens and CLIP's pooled state 32 wide, ids as the pipeline makes them (src/pipelines/flux.ts). */
  transformer: (side: number): Record<string, ort.Tensor> => {
    const [patches, tokens] = [(side / 2) ** 2, 256];
    return {
      hidden_states: new ort.Tensor('float32', wave(patches * 64, Math.sin), [1, patches, 64]),
      encoder_hidden_states: new ort.Tensor('float32', wave(tokens * 32, (i) => Math.cos(i) / 10), [1, tokens, 32]),
      pooled_projections: new ort.Tensor('float32', wave(32, Math.cos), [1, 32]),
      timestep: new ort.Tensor('float32', new Float32Array([0.5]), [1]),
      // Row r of the image's: (0, r / columns, r % columns); the text's all 0. The export takes them as int64.
      img_ids: new ort.Tensor('int64', BigInt64Array.from({ length: patches * 3 }, (_, i) => BigInt([0, Math.floor(i / 3 / (side / 2)), Math.floor(i / 3) % (side / 2)][i % 3])), [patches, 3]),
      txt_ids: new ort.Tensor('int64', new BigInt64Array(tokens * 3), [tokens, 3]),
    };
  },
};

/** The output of a UNet or FLUX transformer (`part`) at `side` from a session of `graph` (its file, or a rewritten graph in memory) on the CPU. */
export async function exportOutput(graph: GraphSource, part: 'unet' | 'transformer', side: number): Promise<Float32Array> {
  const { session } = await createSession(graph, { provider: 'cpu', threads: 1 });
  try {
    return (await session.run(EXPORT_FEEDS[part](side)))[session.outputNames[0]].data as Float32Array;
  } finally {
    await session.release();
  }
}
