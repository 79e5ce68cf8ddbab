import type { FloatTensor, OnnxModel } from '../runtime/onnx-model.js';
import { BatchNoise } from '../runtime/random.js';
import type { GenerationBatch } from '../runtime/types.js';
import { pipelineScheduler, strengthRule, type ModelLayout } from '../models/layout.js';
import { createScheduler, scheduleStrength } from '../schedulers/index.js';
import { predictionOf } from './clean-estimate.js';
import { denoise, startingLatents } from './denoise.js';
import { OnDemand } from './on-demand.js';
import { encodesEveryItem, inpaintingChannels, takesInpaintingInput } from './inpainting-input.js';
import { latentChannels } from './latent-channels.js';
import { LatentPreview, previewLoop } from './preview.js';
import type { GenerateHooks, Pipeline, RgbImage } from './pipeline.js';
import { applyGuidance, concatBatch, concatPerRow, concatRows, filled } from './tensor.js';
import type { TextEncoder } from './text-encoder.js';
import { pictureEncoder, type VaeDecoder, type VaeEncoder } from './vae.js';

/** UNet inputs that carry the text condition, for a batch of prompts. */
type Conditioning = Record<string, FloatTensor>;

/**
 * SD 1.x/2.x, SD-Turbo, LCM and SDXL(-Turbo): a UNet denoising 4-channel latents at 1/8 (the VAE scale) of the image
 * size. The families differ only in how the prompt becomes UNet inputs (`condition`) and in how
 * guidance is applied: a [negative; positive] batch with classifier-free guidance, or LCM's
 * `timestep_cond` embedding of the guidance scale.
 */
export class StableDiffusionPipeline implements Pipeline {
  private readonly latentChannels: number;
  /** An inpainting UNet: it takes the mask and the masked picture's latents beside the sample (inpainting-input.ts). */
  private readonly inpainting: boolean;
  private readonly outputName: string;
  /** Fitted on the first request for previews (streaming). */
  private readonly previews: OnDemand<LatentPreview>;

  constructor(
    readonly layout: ModelLayout,
    private readonly unet: OnnxModel,
    private readonly encoders: TextEncoder[],
    private readonly vae: VaeDecoder,
    private readonly encoder: OnDemand<VaeEncoder>,
  ) {
    this.inpainting = takesInpaintingInput(layout);
    this.latentChannels = latentChannels(layout);
    this.outputName = unet.outputNames.includes('out_sample') ? 'out_sample' : unet.outputNames[0];
    this.previews = new OnDemand(() => LatentPreview.fit(vae, this.latentChannels, layout.vae.scaleFactor));
  }

  /** A UNet that takes the guidance as an embedding (LCM) needs no unconditional copy. */
  samplesPerImage({ guidanceScale }: Pick<GenerationBatch, 'guidanceScale'>): number {
    return !this.unet.hasInput('timestep_cond') && guidanceScale > 1 ? 2 : 1;
  }

  async generate(batch: GenerationBatch, hooks?: GenerateHooks): Promise<(RgbImage | undefined)[]> {
    const count = batch.items.length;
    const scale = this.layout.vae.scaleFactor;
    const [h, w, c] = [batch.height / scale, batch.width / scale, this.latentChannels];
    const scheduler = createScheduler(pipelineScheduler(this.layout, batch.scheduler), batch.scheduler);
    const rule = strengthRule(this.layout, batch.scheduler);
    scheduler.setTimesteps(batch.steps, { strength: scheduleStrength(rule, batch.strength) });

    const timestepCond = this.unet.hasInput('timestep_cond') ? guidanceEmbedding(batch.guidanceScale, count, this.timeCondDim()) : undefined;
    const guided = this.samplesPerImage(batch) === 2;
    const positive = await this.condition(batch.items.map((i) => i.prompt), batch);
    const conditioning = guided ? concatConditioning(await this.negativeCondition(batch, positive), positive) : positive;
    const rows = guided ? 2 * count : count;

    const noise = BatchNoise.forItems(batch.items);
    const shape = { channels: c, height: h, width: w };
    const encoder = pictureEncoder(this.encoder, noise);
    const started = await startingLatents(batch, scheduler, noise, shape, encoder, { rule, inpaintingUnet: this.inpainting });
    // An inpainting UNet is told what to keep and keeps it; other UNets have it put back after each step.
    const extra = this.inpainting ? await inpaintingChannels(batch, shape, encodesEveryItem(this.layout) ? encoder.encode : undefined) : undefined;
    const start = extra ? { ...started, keep: undefined } : started;
    const fixed = this.unet.prepare(timestepCond ? { ...conditioning, timestep_cond: timestepCond } : conditioning);
    const predict = async (x: Float32Array, t: number): Promise<Float32Array> => {
      const sample = extra ? concatPerRow(x, extra, count) : x;
      const feeds = {
        sample: { data: guided ? concatBatch([sample, sample]) : sample, dims: [rows, sample.length / (count * h * w), h, w] },
        timestep: { data: filled(rows, t), dims: [rows] },
      };
      const out = (await this.unet.run(feeds, [this.outputName], fixed))[this.outputName].data;
      return guided ? applyGuidance(out, count, batch.guidanceScale, batch.guidanceRescale) : out;
    };
    const preview = previewLoop(hooks, this.previews, predictionOf(this.layout.scheduler.prediction_type), batch, shape);
    const result = await denoise(scheduler, start, noise, predict, hooks, preview);
    return this.vae.decodeWanted(result, count, c, h, w, hooks?.wanted);
  }

  private timeCondDim(): number {
    const dim = this.layout.denoiserConfig.time_cond_proj_dim;
    return typeof dim === 'number' ? dim : 256;
  }

  /** SDXL has two encoders; every other family has one. `zeroed`: the rows SDXL conditions on zeros. */
  private condition(prompts: string[], batch: GenerationBatch, zeroed: readonly boolean[] = []): Promise<Conditioning> {
    return this.encoders.length === 2 ? this.conditionSdxl(prompts, batch, zeroed) : this.conditionSd(prompts);
  }

  /**
   * The items' negative prompts, none read as the empty prompt, except that SDXL conditions an item
   * that has none on zeros (see conditionSdxl): when every one is zeroed, the zeros are made here,
   * shaped like the positive conditioning, without running both encoders.
   */
  private negativeCondition(batch: GenerationBatch, positive: Conditioning): Promise<Conditioning> | Conditioning {
    const prompts = batch.items.map((i) => i.negativePrompt ?? '');
    const zeroed = batch.items.map((i) => this.encoders.length === 2 && this.layout.forceZerosForEmptyPrompt && i.negativePrompt === undefined);
    if (!zeroed.every(Boolean)) return this.condition(prompts, batch, zeroed);
    const zerosLike = (t: FloatTensor): FloatTensor => ({ data: new Float32Array(t.data.length), dims: t.dims });
    return { encoder_hidden_states: zerosLike(positive.encoder_hidden_states), text_embeds: zerosLike(positive.text_embeds), time_ids: positive.time_ids };
  }

  private async conditionSd(prompts: string[]): Promise<Conditioning> {
    const { last_hidden_state } = await this.encoders[0].encode(prompts, ['last_hidden_state']);
    return { encoder_hidden_states: last_hidden_state };
  }

  /**
   * Both encoders' penultimate layers side by side, the second encoder's pooled `text_embeds`, and the
   * size conditioning. The `zeroed` rows (items with no negative prompt) become zeros
   * (`force_zeros_for_empty_prompt`), as SDXL was trained.
   */
  private async conditionSdxl(prompts: string[], batch: GenerationBatch, zeroed: readonly boolean[]): Promise<Conditioning> {
    const [enc1, enc2] = this.encoders;
    const layer1 = enc1.penultimateHiddenState();
    const layer2 = enc2.penultimateHiddenState();
    const out1 = await enc1.encode(prompts, [layer1]);
    const out2 = await enc2.encode(prompts, [layer2, 'text_embeds']);
    const hidden = concatLastAxis(out1[layer1], out2[layer2]);
    const pooled = out2.text_embeds;
    zeroRows(zeroed, prompts.length, [hidden, pooled]);
    const n = prompts.length;
    const timeIds = new Float32Array(n * 6);
    for (let b = 0; b < n; b++) timeIds.set([batch.height, batch.width, 0, 0, batch.height, batch.width], b * 6);
    return { encoder_hidden_states: hidden, text_embeds: pooled, time_ids: { data: timeIds, dims: [n, 6] } };
  }

  async release(): Promise<void> {
    await Promise.all([this.unet.release(), this.vae.release(), this.encoder.release(), ...this.encoders.map((e) => e.model.release())]);
  }
}

/** LCM's guidance input: a sinusoidal embedding of (w - 1) * 1000, as diffusers' get_guidance_scale_embedding. */
function guidanceEmbedding(guidanceScale: number, batch: number, dim: number): FloatTensor {
  const w = (guidanceScale - 1) * 1000;
  const half = dim / 2;
  const step = Math.log(10000) / (half - 1);
  const row = new Float32Array(dim);
  for (let i = 0; i < half; i++) {
    const angle = w * Math.exp(-step * i);
    row[i] = Math.sin(angle);
    row[half + i] = Math.cos(angle);
  }
  const data = new Float32Array(batch * dim);
  for (let b = 0; b < batch; b++) data.set(row, b * dim);
  return { data, dims: [batch, dim] };
}

function concatConditioning(first: Conditioning, second: Conditioning): Conditioning {
  const out: Conditioning = {};
  for (const key of Object.keys(second)) {
    const [a, b] = [first[key], second[key]];
    out[key] = concatRows(a, b);
  }
  return out;
}

/** [b, t, h1] ++ [b, t, h2] -> [b, t, h1 + h2]. */
function concatLastAxis(a: FloatTensor, b: FloatTensor): FloatTensor {
  const [h1, h2] = [a.dims[a.dims.length - 1], b.dims[b.dims.length - 1]];
  return { data: concatPerRow(a.data, b.data, a.data.length / h1), dims: [...a.dims.slice(0, -1), h1 + h2] };
}

/** Zeroes, in each of `tensors` ([rows, ...]), the rows marked in `zeroed`. */
function zeroRows(zeroed: readonly boolean[], rows: number, tensors: FloatTensor[]): void {
  for (const t of tensors) {
    const per = t.data.length / rows;
    zeroed.forEach((zero, b) => {
      if (zero) t.data.fill(0, b * per, (b + 1) * per);
    });
  }
}
