import type { HostTensor, OnnxModel } from '../runtime/onnx-model.js';
import { BatchNoise } from '../runtime/random.js';
import type { GenerationBatch } from '../runtime/types.js';
import { strengthRule, type ModelLayout } from '../models/layout.js';
import { createScheduler } from '../schedulers/index.js';
import { denoise, relayout, startingLatents } from './denoise.js';
import { OnDemand } from './on-demand.js';
import { LatentPreview, previewLoop } from './preview.js';
import type { GenerateHooks, Pipeline, RgbImage } from './pipeline.js';
import { FLUX_LATENT_CHANNELS as LATENT_CHANNELS } from './latent-channels.js';
import { filled } from './tensor.js';
import type { TextEncoder } from './text-encoder.js';
import { pictureEncoder, type VaeDecoder, type VaeEncoder } from './vae.js';

/**
 * FLUX.1 schnell and dev: a rectified-flow transformer over 2x2-packed 16-channel latents, conditioned
 * on T5 token states and the CLIP pooled vector. dev takes the guidance scale as an input (guidance
 * distillation) instead of a classifier-free batch.
 */
export class FluxPipeline implements Pipeline {
  /** Fitted on the first request for previews (streaming). */
  private readonly previews: OnDemand<LatentPreview>;

  constructor(
    readonly layout: ModelLayout,
    private readonly transformer: OnnxModel,
    private readonly clip: TextEncoder,
    private readonly t5: TextEncoder,
    private readonly vae: VaeDecoder,
    private readonly encoder: OnDemand<VaeEncoder>,
  ) {
    this.previews = new OnDemand(() => LatentPreview.fit(vae, LATENT_CHANNELS, layout.vae.scaleFactor));
  }

  /** dev takes the guidance as an input, schnell none: never an unconditional copy. */
  samplesPerImage(): number {
    return 1;
  }

  async generate(batch: GenerationBatch, hooks?: GenerateHooks): Promise<(RgbImage | undefined)[]> {
    const count = batch.items.length;
    const scale = this.layout.vae.scaleFactor;
    const [h, w] = [batch.height / scale, batch.width / scale];
    const [h2, w2] = [h / 2, w / 2];
    const seqLen = h2 * w2;
    const prompts = batch.items.map((i) => i.prompt);
    const { pooler_output } = await this.clip.encode(prompts, ['pooler_output']);
    const { last_hidden_state } = await this.t5.encode(prompts, ['last_hidden_state']);
    const textLen = last_hidden_state.dims[1];

    const scheduler = createScheduler(this.layout.scheduler, batch.scheduler);
    scheduler.setTimesteps(batch.steps, { mu: shiftMu(seqLen, this.layout.scheduler) });
    const noise = BatchNoise.forItems(batch.items);
    const shape = { channels: LATENT_CHANNELS, height: h, width: w };
    const start = relayout(await startingLatents(batch, scheduler, noise, shape, pictureEncoder(this.encoder, noise), { rule: strengthRule(this.layout, batch.scheduler) }), (x) => pack(x, count, h, w));

    const feeds: Record<string, HostTensor> = {
      encoder_hidden_states: last_hidden_state,
      pooled_projections: pooler_output,
      img_ids: imageIds(h2, w2),
      txt_ids: { data: new Float32Array(textLen * 3), dims: [textLen, 3] },
    };
    if (this.transformer.hasInput('guidance')) feeds.guidance = { data: filled(count, batch.guidanceScale), dims: [count] };
    const fixed = this.transformer.prepare(feeds);
    const predict = async (x: Float32Array, t: number): Promise<Float32Array> => {
      const out = await this.transformer.run(
        {
          hidden_states: { data: x, dims: [count, seqLen, LATENT_CHANNELS * 4] },
          // diffusers' timesteps are sigma * 1000; the exported transformer takes sigma.
          timestep: { data: filled(count, t / 1000), dims: [count] },
        },
        ['out_hidden_states'],
        fixed,
      );
      return out.out_hidden_states.data;
    };
    const preview = previewLoop(hooks, this.previews, 'flow', batch, shape, (clean) => unpack(clean, count, h, w));
    const result = await denoise(scheduler, start, noise, predict, hooks, preview);
    return this.vae.decodeWanted(unpack(result, count, h, w), count, LATENT_CHANNELS, h, w, hooks?.wanted);
  }

  async release(): Promise<void> {
    await Promise.all([this.transformer.release(), this.vae.release(), this.encoder.release(), this.clip.model.release(), this.t5.model.release()]);
  }
}

/** Dynamic shifting: mu grows linearly with the packed sequence length (base_shift at 256, max_shift at 4096). */
function shiftMu(seqLen: number, config: ModelLayout['scheduler']): number | undefined {
  if (!config.use_dynamic_shifting) return undefined;
  const [baseLen, maxLen] = [config.base_image_seq_len ?? 256, config.max_image_seq_len ?? 4096];
  const [baseShift, maxShift] = [config.base_shift ?? 0.5, config.max_shift ?? 1.15];
  const m = (maxShift - baseShift) / (maxLen - baseLen);
  return seqLen * m + (baseShift - m * baseLen);
}

/** Row i*W2+j = (0, i, j): the position of each 2x2 patch. */
function imageIds(h2: number, w2: number): HostTensor {
  const data = new Float32Array(h2 * w2 * 3);
  for (let i = 0; i < h2; i++) {
    for (let j = 0; j < w2; j++) {
      data[(i * w2 + j) * 3 + 1] = i;
      data[(i * w2 + j) * 3 + 2] = j;
    }
  }
  return { data, dims: [h2 * w2, 3] };
}

/** Index into packed latents of lat[b, c, 2i+dy, 2j+dx]; pack and unpack are this map and its inverse. */
function forEachPatchElement(batch: number, h: number, w: number, fn: (packed: number, unpacked: number) => void): void {
  const [h2, w2, c16] = [h / 2, w / 2, LATENT_CHANNELS];
  for (let b = 0; b < batch; b++) {
    for (let c = 0; c < c16; c++) {
      for (let y = 0; y < h; y++) {
        for (let x = 0; x < w; x++) {
          const token = (y >> 1) * w2 + (x >> 1);
          const feature = c * 4 + (y & 1) * 2 + (x & 1);
          fn((b * h2 * w2 + token) * c16 * 4 + feature, ((b * c16 + c) * h + y) * w + x);
        }
      }
    }
  }
}

function pack(latents: Float32Array, batch: number, h: number, w: number): Float32Array {
  const out = new Float32Array(latents.length);
  forEachPatchElement(batch, h, w, (p, u) => (out[p] = latents[u]));
  return out;
}

function unpack(packed: Float32Array, batch: number, h: number, w: number): Float32Array {
  const out = new Float32Array(packed.length);
  forEachPatchElement(batch, h, w, (p, u) => (out[u] = packed[p]));
  return out;
}
