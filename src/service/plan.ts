import { ApiError, quoteList } from '../api/errors.js';
import { dialectOf, servedSizes } from '../api/dialects.js';
import type { GenerationRequest } from '../api/wire.js';
import type { ModelEntry } from '../models/registry.js';
import { MAX_SEED, randomSeed, type NoiseKind } from '../runtime/random.js';
import { MAX_STEPS, type BatchItem, type GenerationBatch } from '../runtime/types.js';
import { checkSchedule, fewestSteps, honoursStrength, passesRun, scheduleStrength, stepsRun, type StrengthRule } from '../schedulers/index.js';
import { strengthRule, takesGuidance, takesNegativePrompt } from '../models/layout.js';
import { chunks } from '../util/chunks.js';
import type { EditPicture } from './input-images.js';
import { messageOf } from '../util/error-message.js';

/**
 * A request as engine batches: its size, steps, guidance and scheduler from the model's preset unless
 * the request sets them, one seed per image, an edit's picture and strength, split by the model's
 * max_batch. The checks that depend on the model throw OpenAI errors here.
 */

/**
 * The 400 for a size the model does not serve under the name the request used, naming those it does;
 * `auto` is named as what it runs at (requestSize's).
 */
function sizeError(request: GenerationRequest, model: ModelEntry, served: readonly string[], auto: string): ApiError {
  const message =
    dialectOf(request.model) === 'gpt-image'
      ? `Invalid value: '${request.size}'. Supported values for model '${request.model}' are: ${quoteList(['auto', ...served])} ('auto' is ${auto}). ` +
        `The installed model '${model.id}' serves ${quoteList(model.preset.sizes)} when asked for by that name.`
      : `Invalid value: '${request.size}'. Supported values are: ${quoteList(served)}. ` +
        `The server serves another size (both sides multiples of ${model.layout.sizeMultiple}) once it is in 'sizes' in the model's imagegen.json.`;
  return ApiError.invalid('size', 'invalid_value', message);
}

/**
 * `auto` (or none) is the model's default, or for an edit the size of the picture's shape (pictureSize);
 * any other size must be one the model serves under the name used (servedSizes).
 */
function requestSize(request: GenerationRequest, model: ModelEntry, picture?: Shape): Shape {
  const { sizes, defaultSize } = model.preset;
  const served = servedSizes(request.model, sizes);
  const auto = picture ? pictureSize(picture, served, defaultSize) : defaultSize;
  const asked = request.size === 'auto' ? undefined : request.size;
  if (asked === undefined) return parseSize(auto);
  if (!served.includes(asked)) throw sizeError(request, model, served, picture && served.length > 0 ? `${auto} for this picture, the served size nearest its shape` : auto);
  return parseSize(asked);
}

interface Shape {
  width: number;
  height: number;
}

const parseSize = (size: string): Shape => {
  const [width, height] = size.split('x').map(Number);
  return { width, height };
};

/**
 * The size an edit without one runs at: of those served, the one nearest the picture's aspect ratio (a
 * landscape photo stays landscape, as OpenAI's `auto` and diffusers' image-to-image, which runs at the
 * picture's size, keep it), so that fitting the picture to it crops least; among those as near, the one
 * nearest the default size's area, the default itself first. A model that serves squares only edits
 * every picture square, centre-cropped.
 */
function pictureSize(picture: Shape, served: readonly string[], defaultSize: string): string {
  const aspect = (shape: Shape) => Math.abs(Math.log(shape.width / shape.height / (picture.width / picture.height)));
  const area = (shape: Shape) => Math.abs(Math.log((shape.width * shape.height) / (fallback.width * fallback.height)));
  const fallback = parseSize(defaultSize);
  // Ratios that differ by rounding alone (sides that are multiples of 8 or 64) count as the same.
  const key = (size: string) => {
    const shape = parseSize(size);
    return [Math.round(aspect(shape) * 100), area(shape)];
  };
  // The default first: a size only as near does not replace it.
  return served.reduce((best, size) => (compareKeys(key(size), key(best)) < 0 ? size : best), defaultSize);
}

const compareKeys = (a: readonly number[], b: readonly number[]) => a.map((value, i) => value - b[i]).find((d) => d !== 0) ?? 0;

/** A scheduler the model does not run is refused with those it does, and, for one of its kind that its scheduler config rules out, why. */
function checkScheduler(request: GenerationRequest, model: ModelEntry): void {
  const allowed = model.schedulers;
  if (request.scheduler !== undefined && !allowed.includes(request.scheduler)) {
    const refusal = model.refusedSchedulers.find((refused) => refused.name === request.scheduler);
    const why = refusal ? ` Model '${request.model}'${installedAs(request, model)} cannot run it with its scheduler_config.json: ${refusal.reason}.` : '';
    throw ApiError.invalid(
      'scheduler',
      'invalid_value',
      `Invalid value: '${request.scheduler}'.${why} Supported values for model '${request.model}' are: ${quoteList(allowed)}.`,
    );
  }
}

/** " (the installed model 'x')" where the request named the model by another name (an alias, a dall-e name). */
function installedAs(request: GenerationRequest, model: ModelEntry): string {
  return model.id === request.model ? '' : ` (the installed model '${model.id}')`;
}

/**
 * A request may not ask for what its model would ignore without a word. diffusers runs no guidance at
 * a scale of 1 or less: above that a request asks for some, which a model that takes none would ignore;
 * a negative prompt, which a model without a classifier-free batch never reads (see takesNegativePrompt).
 * A negative prompt on a model that could read one, at a guidance of 1 or less, is ignored as diffusers
 * ignores it: the request's guidance_scale (or its style's preset) decides, and docs/api.md says so.
 */
function checkGuidance(request: GenerationRequest, model: ModelEntry): void {
  if (request.guidance_scale !== undefined && request.guidance_scale > 1 && !takesGuidance(model.layout)) {
    throw ApiError.invalid(
      'guidance_scale',
      'unsupported_value',
      `Unsupported value: 'guidance_scale' ${request.guidance_scale} with model '${request.model}'${installedAs(request, model)}: it is a ${model.layout.variant} model, distilled to run without guidance (it has no classifier-free batch and no guidance input). Omit 'guidance_scale' or set it to 0.`,
    );
  }
  if (request.negative_prompt && !takesNegativePrompt(model.layout)) {
    throw ApiError.invalid(
      'negative_prompt',
      'unsupported_value',
      `Unsupported value: 'negative_prompt' with model '${request.model}'${installedAs(request, model)}: it is a ${model.layout.variant} model, which runs no classifier-free batch, the only part of a generation that reads a negative prompt. Omit 'negative_prompt' (or send it empty).`,
    );
  }
}

/**
 * The steps of a request. For an edit, a strength runs only that share of them (diffusers'
 * img2img): when the request left the steps to the preset they are raised until the strength is
 * honoured (honoursStrength: a turbo model's single step would otherwise run none below strength 1,
 * FLUX schnell's 4 at the default 0.8 would start from noise alone and ignore the picture); steps the
 * request named are kept, and ones that do not honour it are a 400 naming the fewest that do.
 */
function stepsOf(request: GenerationRequest, model: ModelEntry, strength: number | undefined, rule: StrengthRule): number {
  const preset = model.preset.steps[request.quality];
  if (strength === undefined) return request.steps ?? preset;
  const fewest = fewestSteps(strength, rule);
  if (fewest === undefined) {
    throw ApiError.invalid(
      'strength',
      'invalid_value',
      `Invalid value: strength ${strength} starts from pure noise at any number of steps up to ${MAX_STEPS}, so nothing of the picture would show where it is redrawn: the model's schedule begins at noise alone. Lower 'strength', or set it to 1 to redraw the whole picture.`,
    );
  }
  if (request.steps === undefined) return Math.max(preset, fewest);
  if (honoursStrength(request.steps, strength, rule)) return request.steps;
  const noStep = stepsRun(request.steps, strength, rule) < 1;
  const why = noStep
    ? 'leaves no step to run'
    : `starts from pure noise (the model's schedule begins at noise alone, and int(${request.steps} - ${request.steps} x ${strength}) = 0 starts at its first step), so nothing of the picture would show where it is redrawn`;
  throw ApiError.invalid(
    request.strength === undefined ? 'steps' : 'strength',
    'invalid_value',
    `Invalid value: strength ${strength} of ${request.steps} steps ${why}. Raise 'steps' to at least ${fewest}, ${noStep ? 'raise' : 'lower'} 'strength', or omit 'steps'.`,
  );
}

/** A batch as planned: it says the denoiser passes it makes (GenerationBatch.passes). */
export type PlannedBatch = GenerationBatch & { passes: number };

/** Image i gets seed + i, so each image's seed reproduces it alone; wraps past MAX_SEED. */
function seeds(request: GenerationRequest): number[] {
  const base = request.seed ?? randomSeed();
  return Array.from({ length: request.n }, (_, i) => (base + i) % (MAX_SEED + 1));
}

/**
 * What a request asks the engine for: its size, steps, guidance and scheduler from the model's preset
 * unless the request sets them, one seed per image, split into batches of at most the model's maxBatch;
 * an edit's strength, and its size from its picture's shape unless the request sets one. Throws the OpenAI errors of the checks that depend on the model. An edit's
 * picture is fitted to the size planned only once the plan passed (see withPicture): fitting is the
 * costliest part of taking an edit, and a request refused here should not pay for it.
 */
export function planBatches(request: GenerationRequest, model: ModelEntry, defaultRng: NoiseKind = 'native', edit?: { strength: number; picture: Shape }): PlannedBatch[] {
  const { width, height } = requestSize(request, model, edit?.picture);
  checkScheduler(request, model);
  checkGuidance(request, model);
  const { preset } = model;
  const rng = request.rng ?? defaultRng;
  const items: BatchItem[] = seeds(request).map((seed) => ({
    prompt: request.prompt,
    negativePrompt: request.negative_prompt ?? preset.negativePrompt,
    seed,
    rng,
    output: { format: request.output_format, ...(request.output_compression !== undefined && { compression: request.output_compression }) },
    ...(request.stream && request.partial_images && { partialImages: request.partial_images }),
  }));
  const scheduler = request.scheduler ?? preset.scheduler;
  const rule = strengthRule(model.layout, scheduler);
  const settings = {
    modelDir: model.layout.dir,
    modelVersion: model.version,
    width,
    height,
    steps: stepsOf(request, model, edit?.strength, rule),
    ...(edit && { strength: edit.strength }),
    guidanceScale: request.guidance_scale ?? preset.guidanceScale[request.style],
    guidanceRescale: preset.guidanceRescale,
    scheduler,
    maxBatch: preset.maxBatch,
  };
  // A latent consistency model's own pipeline picks its steps among those the strength leaves (strength.ts).
  const bounding = scheduleStrength(rule, edit?.strength);
  try {
    checkSchedule(model.layout.scheduler, settings.scheduler, settings.steps, bounding);
  } catch (err) {
    // Steps the request left to the preset but a low strength raised (stepsOf), or fewer steps than the
    // preset's left by a strength that bounds them, are the strength's doing.
    const raised = edit !== undefined && request.steps === undefined && settings.steps > preset.steps[request.quality];
    const param = request.steps !== undefined ? 'steps' : raised || bounding !== undefined ? 'strength' : 'scheduler';
    const why = raised ? ` (strength ${edit.strength} runs one step only of ${settings.steps} or more). Raise 'strength'` : param === 'strength' ? ". Raise 'strength'" : '';
    throw ApiError.invalid(param, 'invalid_value', `Invalid value for '${param}' with model '${request.model}': ${messageOf(err)}${why}.`);
  }
  const passes = passesRun(model.layout.scheduler, settings.scheduler, settings.steps, edit?.strength, rule);
  return chunks(items, preset.maxBatch).map((part) => ({ ...settings, passes, items: part }));
}

/** The batches with an edit's picture (at their size) going with every image. */
export function withPicture(batches: PlannedBatch[], { image, mask }: EditPicture): PlannedBatch[] {
  return batches.map((batch) => ({ ...batch, items: batch.items.map((item) => ({ ...item, image, ...(mask && { mask }) })) }));
}
