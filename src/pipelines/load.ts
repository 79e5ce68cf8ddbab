import { OnnxModel } from '../runtime/onnx-model.js';
import type { RuntimeOptions, SessionTuning } from '../runtime/providers.js';
import { inspectModel, ModelLayoutError, type ModelLayout } from '../models/layout.js';
import { loadTokenizer } from '../tokenizers/load.js';
import { FluxPipeline } from './flux.js';
import type { Pipeline } from './pipeline.js';
import { StableDiffusionPipeline } from './stable-diffusion.js';
import { TextEncoder } from './text-encoder.js';
import { OnDemand } from './on-demand.js';
import { VaeDecoder, VaeEncoder } from './vae.js';

/** T5 sequence length: FLUX schnell was distilled at 256 tokens, dev at 512. */
const T5_LENGTH = { 'flux-schnell': 256, 'flux-dev': 512 } as const;

/** Loads every component of a model folder and builds the pipeline for its family. */
export async function loadPipeline(dir: string, runtime: RuntimeOptions): Promise<Pipeline> {
  const layout = await inspectModel(dir);
  // Sessions hold native memory: when a later component fails, the ones already open are released.
  const opened: OnnxModel[] = [];
  const load = async (file: string, tuning?: SessionTuning) => {
    try {
      const model = await OnnxModel.load(file, runtime, tuning);
      opened.push(model);
      return model;
    } catch (err) {
      throw new ModelLayoutError(layout.dir, `cannot load ${file}: ${(err as Error).message.split('\n')[0]}`);
    }
  };
  try {
    // The decoder runs once per image at full resolution: an arena would keep its peak for good.
    const vae = new VaeDecoder(await load(layout.vaeDecoder, { memoryArena: false }), layout.vae.scalingFactor, layout.vae.shiftFactor);
    const encoder = new TextEncoder(await load(layout.textEncoder), await loadTokenizer(layout.tokenizer));
    const denoiser = await load(layout.denoiser);
    const second = await secondEncoder(layout, load);
    const vaeEncoder = new OnDemand(async () => {
      if (!layout.vaeEncoder) throw new ModelLayoutError(layout.dir, 'image-to-image needs vae_encoder/model.onnx, which this export lacks: export the model again with its VAE encoder');
      return new VaeEncoder(await load(layout.vaeEncoder, { memoryArena: false }), layout.vae.scalingFactor, layout.vae.shiftFactor);
    });
    if (layout.family === 'flux') return new FluxPipeline(layout, denoiser, encoder, second!, vae, vaeEncoder);
    return new StableDiffusionPipeline(layout, denoiser, second ? [encoder, second] : [encoder], vae, vaeEncoder);
  } catch (err) {
    await Promise.allSettled(opened.map((m) => m.release()));
    throw err;
  }
}

async function secondEncoder(layout: ModelLayout, load: (file: string) => Promise<OnnxModel>): Promise<TextEncoder | undefined> {
  if (!layout.textEncoder2 || !layout.tokenizer2) return undefined;
  const maxLength = layout.variant === 'flux-schnell' || layout.variant === 'flux-dev' ? T5_LENGTH[layout.variant] : undefined;
  return new TextEncoder(await load(layout.textEncoder2), await loadTokenizer(layout.tokenizer2, { maxLength }));
}
