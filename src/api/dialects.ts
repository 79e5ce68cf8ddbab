import { QUALITY_TIERS, type Quality } from '../families/family.js';
import { ApiError, quoteList } from './errors.js';

/**
 * OpenAI's image model names, as the current SDKs enumerate them (openai-node 7's `ImageModel`), and what
 * each means on the wire. Apps hard-code the names, so each is an alias of an installed model (config.ts
 * maps them to DEFAULT_MODEL unless MODEL_ALIASES says otherwise), and a request that uses one is read
 * and answered as that OpenAI model would: its dialect. OpenAI retired dall-e-2 and dall-e-3 (May 2026)
 * and shut gpt-image-1 down (October 2026); code written for them still runs here.
 */

const DALL_E_MODEL_NAMES = ['dall-e-2', 'dall-e-3'] as const;

/** GPT Image 2.5's names: sizes as gpt-image-2's, and quality also `xhigh` and `max`. */
const GPT_IMAGE_2_5_NAMES: readonly string[] = ['gpt-image-2.5-sunburst', 'gpt-image-2.5-sunburst-2026-09-08', 'gpt-image-2.5-flare', 'gpt-image-2.5-flare-2026-09-08'];

export const GPT_IMAGE_MODEL_NAMES = [
  'gpt-image-1',
  'gpt-image-1-mini',
  'gpt-image-1.5',
  'gpt-image-2',
  'gpt-image-2-2026-04-21',
  'gpt-image-2.5-sunburst',
  'gpt-image-2.5-sunburst-2026-09-08',
  'gpt-image-2.5-flare',
  'gpt-image-2.5-flare-2026-09-08',
  'gpt-image-2.6-sunburst',
  'gpt-image-2.6-flare',
  'chatgpt-image-latest',
] as const;

export const OPENAI_MODEL_NAMES = [...DALL_E_MODEL_NAMES, ...GPT_IMAGE_MODEL_NAMES] as const;

/**
 * `gpt-image` (the gpt-image names): b64_json by default, quality low|medium|high|auto, the gpt-image
 * sizes, and the response echoes its settings and carries usage. `dall-e` (the dall-e names, and also
 * installed models' own ids and custom aliases, which answer as they always did): url by default,
 * quality standard|hd (the gpt-image values accepted too), every size the model lists.
 */
export type Dialect = 'gpt-image' | 'dall-e';

export function dialectOf(modelName: string): Dialect {
  return (GPT_IMAGE_MODEL_NAMES as readonly string[]).includes(modelName) ? 'gpt-image' : 'dall-e';
}

export const RESPONSE_FORMATS = ['url', 'b64_json'] as const;
export type ResponseFormat = (typeof RESPONSE_FORMATS)[number];

/** gpt-image models answer inline; `url` stays available to them when asked for (our extension). */
export const DEFAULT_RESPONSE_FORMAT: Record<Dialect, ResponseFormat> = { 'gpt-image': 'b64_json', 'dall-e': 'url' };

/** The sizes every one of OpenAI's gpt-image models takes. */
const GPT_IMAGE_SIZES: readonly string[] = ['1024x1024', '1536x1024', '1024x1536'];

/** Whether `size` is one of the three sizes every gpt-image model takes (the enum older SDKs type answers' sizes as). */
export const isGptImageSize = (size: string): boolean => GPT_IMAGE_SIZES.includes(size);

/** The gpt-image names that take sizes beyond the three (openai-node's `ImageGenerateParams.size`). */
const FREE_SIZE_MODEL_NAMES: readonly string[] = ['gpt-image-2', 'gpt-image-2-2026-04-21', ...GPT_IMAGE_2_5_NAMES];

/**
 * Whether OpenAI's model of this gpt-image name takes a size: the three gpt-image sizes, and for
 * gpt-image-2 and 2.5 any WxH whose sides are multiples of 16, whose aspect ratio is within 1:3 to 3:1
 * and which is at most 3840x2160 (long side 3840, short side 2160).
 */
export function gptImageNameTakes(modelName: string, size: string): boolean {
  if (isGptImageSize(size)) return true;
  if (!FREE_SIZE_MODEL_NAMES.includes(modelName)) return false;
  const [width, height] = size.split('x').map(Number);
  const [long, short] = width >= height ? [width, height] : [height, width];
  return width % 16 === 0 && height % 16 === 0 && long <= 3 * short && long <= 3840 && short <= 2160;
}

/**
 * The sizes of a model that a request may name under `modelName`: all of them under its own id, a dall-e
 * name or another alias; under a gpt-image name only those OpenAI's model of that name takes. A
 * request without a model is checked under its default's id, whatever its dialect, so nothing it was
 * given before is refused.
 */
export function servedSizes(modelName: string, sizes: readonly string[]): readonly string[] {
  return dialectOf(modelName) === 'gpt-image' ? sizes.filter((size) => gptImageNameTakes(modelName, size)) : sizes;
}

/**
 * The longest prompt OpenAI's dall-e models take, shorter than the server's own 32000 characters, as the
 * SDKs document them (ImageGenerateParams.prompt): a request naming one of them is held to it, so that
 * code that works here works against OpenAI too. Installed ids, other aliases and requests without a
 * model keep the server's limit, as they keep every size. `n` stays 1 to 10 under every name, as the
 * interface this server implements says (OpenAI's dall-e-3 takes only 1).
 */
export const DALL_E_PROMPT_LIMITS: Readonly<Record<string, number>> = {
  'dall-e-2': 1000,
  'dall-e-3': 4000,
};

/** Every `quality` the SDKs send: dall-e's standard|hd, gpt-image's low|medium|high|auto, GPT Image 2.5's xhigh|max. */
export const REQUEST_QUALITIES = ['standard', 'hd', 'low', 'medium', 'high', 'xhigh', 'max', 'auto'] as const;
export type RequestQuality = (typeof REQUEST_QUALITIES)[number];

const GPT_IMAGE_QUALITIES: readonly RequestQuality[] = ['low', 'medium', 'high', 'auto'];
const GPT_IMAGE_2_5_QUALITIES: readonly RequestQuality[] = ['low', 'medium', 'high', 'xhigh', 'max', 'auto'];

/** The request fields only OpenAI's gpt-image models take (the SDKs document each as "GPT image models only"). */
const GPT_IMAGE_ONLY_FIELDS = ['output_format', 'output_compression', 'background', 'moderation', 'partial_images', 'complexity'] as const;

/**
 * The dialect of a request that names no model, as OpenAI read one until it retired dall-e-2 (openai-node
 * 6's `model` docs; 7 names no default and asks for a model): a generation is dall-e-2's (so `url` by
 * default, as the interface this server implements says) unless it uses a parameter specific to the
 * gpt-image models, an edit is a gpt-image model's (6 named gpt-image-1.5 its default) unless it asks for
 * dall-e's quality `standard` or `hd`, and variations exist only for dall-e-2. Whichever it is,
 * DEFAULT_MODEL runs.
 */
export function dialectWithoutModel(kind: 'generation' | 'edit' | 'variation', fields: Readonly<Record<string, unknown>>): Dialect {
  const quality = fields.quality as RequestQuality | undefined;
  switch (kind) {
    case 'generation': {
      // `auto` is every model's default quality (the SDKs: "will automatically select the best quality for the given model"), no gpt-image parameter.
      const gptImageQuality = quality !== undefined && quality !== 'auto' && GPT_IMAGE_2_5_QUALITIES.includes(quality);
      const gptImageOnly = GPT_IMAGE_ONLY_FIELDS.some((field) => fields[field] !== undefined) || fields.stream === true || gptImageQuality;
      return gptImageOnly ? 'gpt-image' : 'dall-e';
    }
    case 'edit':
      return quality === 'standard' || quality === 'hd' ? 'dall-e' : 'gpt-image';
    case 'variation':
      return 'dall-e';
  }
}

/** The step tier each quality picks (families/family.ts): every quality a request may name has one. */
const TIERS: Record<RequestQuality, Quality> = QUALITY_TIERS;

/** The quality a gpt-image response echoes (openai-node 7 types it as low|medium|high|xhigh|max). */
export type GptImageQuality = 'low' | 'medium' | 'high' | 'xhigh' | 'max';
const GPT_IMAGE_QUALITY_OF: Record<Quality, GptImageQuality> = { low: 'low', standard: 'medium', hd: 'high' };

/**
 * The quality a gpt-image answer (and each streamed image) echoes: the tier that ran, as OpenAI answers
 * `auto` with the quality it picked (and dall-e's standard and hd, sent without a model, as medium and
 * high). GPT Image 2.5's xhigh and max are echoed as asked, though they run the hd steps as high does:
 * they are settings of their own, not a choice the model made, and code ported from OpenAI that checks
 * the answer's quality against what it asked for finds it.
 */
export function echoedQuality(quality: RequestQuality | undefined, tier: Quality): GptImageQuality {
  return quality === 'xhigh' || quality === 'max' ? quality : GPT_IMAGE_QUALITY_OF[tier];
}

/**
 * The qualities a request may name under `modelName` (listed by /v1/models, so a client offers no other):
 * gpt-image names take only the values OpenAI's model of the name takes (xhigh and max only GPT Image
 * 2.5's); the other names (and requests without a model) take all.
 */
export function qualitiesOf(modelName: string): readonly RequestQuality[] {
  if (dialectOf(modelName) === 'dall-e') return REQUEST_QUALITIES;
  return GPT_IMAGE_2_5_NAMES.includes(modelName) ? GPT_IMAGE_2_5_QUALITIES : GPT_IMAGE_QUALITIES;
}

/** The step tier of a request's quality, refused where the model name does not take it (qualitiesOf). */
export function qualityTier(quality: RequestQuality | undefined, modelName: string): Quality {
  if (quality === undefined) return 'standard';
  const taken = qualitiesOf(modelName);
  if (!taken.includes(quality)) {
    throw ApiError.invalid('quality', 'invalid_value', `Invalid value: '${quality}'. Supported values for model '${modelName}' are: ${quoteList(taken)}.`);
  }
  return TIERS[quality];
}
