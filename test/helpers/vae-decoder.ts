import { inspectModel, type ModelLayout } from '../../src/models/layout.js';
import { VaeDecoder } from '../../src/pipelines/vae.js';
import { OnnxModel } from '../../src/runtime/onnx-model.js';

/** A model folder's VAE decoder on the CPU, as its pipeline would make it (without a tiler), and the folder's layout. */
export async function decoder(dir: string): Promise<{ layout: ModelLayout; vae: VaeDecoder }> {
  const layout = await inspectModel(dir);
  const model = await OnnxModel.load(layout.vaeDecoder, { provider: 'cpu', threads: 2 }, { memoryArena: false });
  return { layout, vae: new VaeDecoder(model, layout.vae.scalingFactor, layout.vae.shiftFactor) };
}
