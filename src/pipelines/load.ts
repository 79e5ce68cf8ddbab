import { OnnxModel, OnnxOutOfMemoryError } from '../runtime/onnx-model.js';
import { GpuFaultError } from '../runtime/gpu-faults.js';
import type { RuntimeOptions, SessionTuning } from '../runtime/providers.js';
import type { PipelineKind } from '../families/family.js';
import { familyEntry } from '../families/index.js';
import { inspectModel, ModelLayoutError, removedOr, type ModelLayout } from '../models/layout.js';
import { loadModelTokenizer } from '../models/model-tokenizer.js';
import { FluxPipeline } from './flux.js';
import type { Pipeline } from './pipeline.js';
import { StableDiffusionPipeline } from './stable-diffusion.js';
import { TextEncoder } from './text-encoder.js';
import { OnDemand } from './on-demand.js';
import { VaeDecoder, VaeEncoder, type VaeTiler } from './vae.js';
import { firstLineOf } from '../util/error-message.js';

/**
 * The worker's MemoryPlan as the pipelines see it: it decides whether a model's VAE decodes whole or in
 * tiles (without one it decodes whole), and hears when a batch's pictures are encoded.
 */
export interface DecodePlanner {
  vaeTiler(layout: ModelLayout): VaeTiler;
  /** The VAE encoder has encoded a batch's pictures (image-to-image): what the batch takes from here is its denoising. */
  encoded(): void;
}

/** A model's loaded components, which each pipeline takes what it needs of. */
interface Components {
  layout: ModelLayout;
  denoiser: OnnxModel;
  encoders: TextEncoder[];
  vae: VaeDecoder;
  vaeEncoder: OnDemand<VaeEncoder>;
}

/** The pipeline each kind a family names (src/families/) is built with. */
const PIPELINES: Record<PipelineKind, (parts: Components) => Pipeline> = {
  'stable-diffusion': ({ layout, denoiser, encoders, vae, vaeEncoder }) => new StableDiffusionPipeline(layout, denoiser, encoders, vae, vaeEncoder),
  flux: ({ layout, denoiser, encoders: [clip, t5], vae, vaeEncoder }) => new FluxPipeline(layout, denoiser, clip, t5, vae, vaeEncoder),
};

/** Loads every component of a model folder and builds the pipeline its family names. */
export async function loadPipeline(dir: string, runtime: RuntimeOptions, memory?: DecodePlanner): Promise<Pipeline> {
  const layout = await inspectModel(dir);
  const family = familyEntry(layout.family);
  // Sessions hold native memory: when a later component fails, the ones already open are released.
  const opened: OnnxModel[] = [];
  const load = async (file: string, tuning?: SessionTuning) => {
    try {
      const model = await OnnxModel.load(file, runtime, tuning);
      opened.push(model);
      return model;
    } catch (err) {
      // Running out of memory, or a GPU fault, says nothing about the folder: the caller reports it as what it is.
      if (err instanceof OnnxOutOfMemoryError || err instanceof GpuFaultError) throw err;
      throw new ModelLayoutError(layout.dir, `cannot load ${file}: ${firstLineOf(err)}`);
    }
  };
  try {
    // The decoder runs once per image at full resolution: an arena would keep its peak for good.
    const vae = new VaeDecoder(await load(layout.vaeDecoder, { memoryArena: false }), layout.vae.scalingFactor, layout.vae.shiftFactor, memory?.vaeTiler(layout));
    const encoder = new TextEncoder(await load(layout.textEncoder), await loadModelTokenizer(layout.dir, layout.tokenizer));
    const denoiser = await load(layout.denoiser);
    const second = await secondEncoder(layout, family.secondEncoderLength?.[layout.variant], load);
    const vaeEncoder = new OnDemand(async () => {
      if (!layout.vaeEncoder) throw new ModelLayoutError(layout.dir, 'image-to-image needs vae_encoder/model.onnx, which this export lacks: export the model again with its VAE encoder');
      return new VaeEncoder(await load(layout.vaeEncoder, { memoryArena: false }), layout.vae.scalingFactor, layout.vae.shiftFactor, () => memory?.encoded());
    });
    return PIPELINES[family.pipeline]({ layout, denoiser, encoders: second ? [encoder, second] : [encoder], vae, vaeEncoder });
  } catch (err) {
    await Promise.allSettled(opened.map((m) => m.release()));
    // Removed while it loaded: said so, not as a model to repair.
    throw await removedOr(layout.dir, err);
  }
}

/** `maxLength`: the sequence length it was trained at, when its family fixes one (T5). */
async function secondEncoder(layout: ModelLayout, maxLength: number | undefined, load: (file: string) => Promise<OnnxModel>): Promise<TextEncoder | undefined> {
  if (!layout.textEncoder2 || !layout.tokenizer2) return undefined;
  return new TextEncoder(await load(layout.textEncoder2), await loadModelTokenizer(layout.dir, layout.tokenizer2, { maxLength }));
}
