import * as ort from 'onnxruntime-node';
import type { GraphSource } from '../../src/runtime/graph-rewrite.js';
import { createSession } from '../../src/runtime/providers.js';

/**
 * Fixed, varied feeds for the SD-style real exports' graphs (4-channel latents of `side` x `side`, text
 * states 32 wide as in ../shared/data/real-exports), for comparing two sessions of one graph: the
 * UNet with guidance's batch of 2, the VAE decoder with one latent.
 */
const wave = (length: number, f: (i: number) => number) => Float32Array.from({ length }, (_, i) => f(i));

export const EXPORT_FEEDS = {
  unet: (side: number): Record<string, ort.Tensor> => ({
    sample: new ort.Tensor('float32', wave(2 * 4 * side * side, Math.sin), [2, 4, side, side]),
    timestep: new ort.Tensor('float32', new Float32Array([500]), []),
    encoder_hidden_states: new ort.Tensor('float32', wave(2 * 77 * 32, (i) => Math.cos(i) / 10), [2, 77, 32]),
  }),
  vae_decoder: (side: number): Record<string, ort.Tensor> => ({ latent_sample: new ort.Tensor('float32', wave(4 * side * side, Math.sin), [1, 4, side, side]) }),
};

/** The UNet's output at `side` from a session of `graph` (its file, or a rewritten graph in memory) on the CPU. */
export async function unetOutput(graph: GraphSource, side: number): Promise<Float32Array> {
  const { session } = await createSession(graph, { provider: 'cpu', threads: 1 });
  try {
    return (await session.run(EXPORT_FEEDS.unet(side)))[session.outputNames[0]].data as Float32Array;
  } finally {
    await session.release();
  }
}
