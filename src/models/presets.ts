import { z } from 'zod';
import { QUALITY_TIERS, type Quality, type Style } from '../families/family.js';
import { familyEntry } from '../families/index.js';
import { MAX_GUIDANCE_SCALE, MAX_STEPS } from '../runtime/types.js';
import { checkSchedule, type SchedulerOffer } from '../schedulers/index.js';
import { messageOf } from '../util/error-message.js';
import { takesGuidance, takesNegativePrompt, type ModelLayout } from './layout.js';

/**
 * What the OpenAI request fields mean for a model: its variant's preset (src/families/) with its
 * folder's overrides. `quality` picks the number of denoising steps (low = fewer steps, faster and
 * rougher; hd = more steps, more detail), `style` picks the classifier-free guidance (vivid =
 * stronger guidance: more saturated and literal; natural = weaker).
 * Guidance-distilled models (turbo, schnell) run without guidance, so style does not change their
 * pictures. A model folder may override any of this in an `imagegen.json`:
 *
 *   { "sizes": ["512x512", "768x512"], "default_size": "512x512", "steps": { "low": 10, "standard": 20, "hd": 40 },
 *     "guidance_scale": { "vivid": 8, "natural": 5 }, "scheduler": "euler", "max_batch": 4,
 *     "guidance_rescale": 0.7, "negative_prompt": "blurry, low quality" }
 */

export interface ModelPreset {
  /** "WxH", in the order the models endpoint lists them. */
  sizes: string[];
  defaultSize: string;
  steps: Record<Quality, number>;
  guidanceScale: Record<Style, number>;
  /** Scheduler name (src/schedulers/index.ts); undefined runs the model's scheduler_config.json. */
  scheduler?: string;
  /** diffusers' guidance_rescale (0..1) against over-exposure, e.g. 0.7 for zero-terminal-SNR models. */
  guidanceRescale: number;
  /** Used when a request sends no negative_prompt; none when imagegen.json names none (see BatchItem.negativePrompt). */
  negativePrompt?: string;
  /** Largest batch given to one worker; a larger n is split into jobs that may run on several workers. */
  maxBatch: number;
}

/** Sizes around a model's training resolution: its square plus the usual landscape/portrait buckets. */
const SIZE_CLASSES: Record<number, string[]> = {
  512: ['512x512', '640x512', '512x640', '768x512', '512x768'],
  768: ['768x768', '1024x768', '768x1024', '1152x768', '768x1152'],
  // SDXL's training buckets plus the dall-e-3 and gpt-image sizes apps ask for.
  1024: ['1024x1024', '1152x896', '896x1152', '1216x832', '832x1216', '1344x768', '768x1344', '1536x1024', '1024x1536', '1792x1024', '1024x1792'],
};

const SIZE_PATTERN = /^([1-9]\d{1,4})x([1-9]\d{1,4})$/;

const size = z.string().regex(SIZE_PATTERN, 'expected "WIDTHxHEIGHT", e.g. "1024x1024"');
const count = z.number().int().min(1);
const steps = count.max(MAX_STEPS);
// As a request's guidance_scale (api/wire.ts): a preset a request could not ask for would run what the API refuses.
const scale = z.number().min(0).max(MAX_GUIDANCE_SCALE);

/**
 * An object of imagegen.json that refuses keys it does not take, naming those it does: an operator who
 * wrote a request's words (`quality`, or gpt-image's `high`) is told the key that sets it (`insteadOf`).
 */
function fields<Shape extends z.ZodRawShape>(shape: Shape, insteadOf: Record<string, string> = {}) {
  return z.strictObject(shape, {
    error: (issue) => {
      if (issue.code !== 'unrecognized_keys') return undefined;
      const hints = issue.keys.filter((key) => Object.hasOwn(insteadOf, key)).map((key) => `: ${insteadOf[key]}`);
      const unknown = issue.keys.map((key) => `'${key}'`).join(', ');
      return `unknown key${issue.keys.length > 1 ? 's' : ''} ${unknown}${hints.join('')}; the keys it takes are ${Object.keys(shape).join(', ')}`;
    },
  });
}

/** Request qualities that name no steps tier, and the tier each runs (QUALITY_TIERS). */
const TIER_OF_QUALITY = Object.entries(QUALITY_TIERS).filter(([quality, tier]) => quality !== tier);

/** The `imagegen.json` a model folder may carry; every field optional. */
export const presetOverrideSchema = fields(
  {
    sizes: z.array(size).min(1).optional(),
    default_size: size.optional(),
    steps: fields(
      { low: steps.optional(), standard: steps.optional(), hd: steps.optional() },
      Object.fromEntries(TIER_OF_QUALITY.map(([quality, tier]) => [quality, `quality ${quality} runs the ${tier} steps, so set ${tier}`])),
    ).optional(),
    guidance_scale: fields({ vivid: scale.optional(), natural: scale.optional() }).optional(),
    scheduler: z.string().min(1).optional(),
    max_batch: count.optional(),
    guidance_rescale: z.number().min(0).max(1).optional(),
    negative_prompt: z.string().optional(),
  },
  {
    quality: 'steps sets the steps of each quality, e.g. {"steps": {"hd": 40}}',
    style: 'guidance_scale sets the guidance of each style, e.g. {"guidance_scale": {"vivid": 8}}',
    size: 'sizes lists the sizes served, default_size the one a request naming none gets',
  },
);

export type PresetOverride = z.infer<typeof presetOverrideSchema>;

class PresetError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PresetError';
  }
}

/**
 * The folder's step counts over its variant's. A tier the folder leaves out follows the standard it
 * sets (low at most, hd at least its standard), so only tiers it sets itself can contradict each other.
 */
function stepTiers(base: Record<Quality, number>, override: PresetOverride['steps']): Record<Quality, number> {
  const standard = override?.standard ?? base.standard;
  return { low: override?.low ?? Math.min(base.low, standard), standard, hd: override?.hd ?? Math.max(base.hd, standard) };
}

/** The side a model was trained at: its denoiser's config, else its family variant's. */
export function nativeSide(layout: Pick<ModelLayout, 'family' | 'variant' | 'nativeSize'>): number {
  return layout.nativeSize ?? familyEntry(layout.family).variants[layout.variant].nativeSize;
}

/**
 * The preset of a model: its variant's defaults, sized for its native resolution, with the folder's
 * `imagegen.json` (already parsed) applied. `schedulers`: those that run this model, and why the others do not.
 */
export function presetFor(
  layout: Pick<ModelLayout, 'family' | 'variant' | 'nativeSize' | 'sizeMultiple' | 'denoiserConfig' | 'scheduler'>,
  override: PresetOverride,
  schedulers: SchedulerOffer,
): ModelPreset {
  const base = familyEntry(layout.family).variants[layout.variant];
  const native = nativeSide(layout);
  const sizes = override.sizes ?? SIZE_CLASSES[native] ?? [`${native}x${native}`];
  const defaultSize = override.default_size ?? (sizes.includes(`${native}x${native}`) ? `${native}x${native}` : sizes[0]);
  const multiple = layout.sizeMultiple;
  const misfits = sizes.filter((size) => size.split('x').some((side) => Number(side) % multiple));
  if (misfits.length) {
    throw new PresetError(`sizes ${misfits.join(', ')} do not fit this model: both sides must be multiples of ${multiple} (from its unet/transformer and vae configs)`);
  }
  if (!sizes.includes(defaultSize)) {
    throw new PresetError(`default_size ${defaultSize} is not one of its sizes (${sizes.join(', ')})`);
  }
  const tiers = stepTiers(base.steps, override.steps);
  // quality asks for more work at each tier: a preset that runs fewer steps for hd than for low is a slip.
  if (!(tiers.low <= tiers.standard && tiers.standard <= tiers.hd)) {
    throw new PresetError(`steps must not fall from low to standard to hd; they are ${tiers.low}, ${tiers.standard} and ${tiers.hd}`);
  }
  const scheduler = override.scheduler;
  if (scheduler !== undefined && !schedulers.running.includes(scheduler)) {
    const refusal = schedulers.refused.find((refused) => refused.name === scheduler);
    const why = refusal ? ` (${refusal.reason})` : '';
    throw new PresetError(`scheduler '${scheduler}' does not fit this model${why}; use one of ${schedulers.running.join(', ')}`);
  }
  checkTiersRun(layout, tiers, scheduler);
  checkReadable(layout, override);
  return {
    sizes: [...new Set(sizes)],
    defaultSize,
    steps: tiers,
    guidanceScale: { ...base.guidanceScale, ...override.guidance_scale },
    scheduler,
    maxBatch: override.max_batch ?? base.maxBatch,
    guidanceRescale: override.guidance_rescale ?? 0,
    negativePrompt: override.negative_prompt,
  };
}

/**
 * Every quality's steps must run on the scheduler the preset runs (LCM's stop at its
 * original_inference_steps, 50): else each request for that quality, which names neither steps nor
 * scheduler, would be refused for what the folder set.
 */
function checkTiersRun(layout: Pick<ModelLayout, 'scheduler'>, tiers: Record<Quality, number>, scheduler: string | undefined): void {
  for (const [quality, steps] of Object.entries(tiers)) {
    try {
      checkSchedule(layout.scheduler, scheduler, steps);
    } catch (err) {
      throw new PresetError(`steps ${quality} ${steps} cannot run on ${scheduler === undefined ? 'its scheduler' : `scheduler '${scheduler}'`}: ${messageOf(err)}`);
    }
  }
}

/**
 * A preset may not set what its model would ignore without a word, as a request may not (service/plan.ts
 * answers the same settings in a request with a 400): a guidance above 1 for a model distilled to run
 * without guidance, a negative prompt or a guidance rescale for one that runs no classifier-free batch
 * (the only part of a generation that reads them). Ignored, every request of the model was made without what its operator set.
 */
function checkReadable(layout: Pick<ModelLayout, 'family' | 'variant' | 'denoiserConfig'>, override: PresetOverride): void {
  const guided = Object.entries(override.guidance_scale ?? {}).filter(([, scale]) => scale !== undefined && scale > 1);
  if (guided.length > 0 && !takesGuidance(layout)) {
    const set = guided.map(([style, scale]) => `${style} ${scale}`).join(', ');
    throw new PresetError(`guidance_scale (${set}) does not fit this model: it is a ${layout.variant} model, distilled to run without guidance. Remove guidance_scale, or set it to 0`);
  }
  // Both are read only by a classifier-free batch, which is what takesNegativePrompt asks of the model.
  const unread = [override.negative_prompt && 'negative_prompt', override.guidance_rescale && 'guidance_rescale'].filter((field) => typeof field === 'string');
  if (unread.length > 0 && !takesNegativePrompt(layout)) {
    throw new PresetError(`${unread.join(' and ')} ${unread.length > 1 ? 'do' : 'does'} not fit this model: a ${layout.variant} model runs no classifier-free batch, the only part of a generation that reads ${unread.length > 1 ? 'them' : 'one'}. Remove ${unread.join(' and ')}`);
  }
}
