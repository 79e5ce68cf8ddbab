import { z } from 'zod';
import { MAX_SEED, NOISE_KINDS } from '../runtime/random.js';
import { IMAGE_FORMATS, MAX_GUIDANCE_SCALE, MAX_STEPS, type OutputFormat } from '../runtime/types.js';
import { STYLES, type Quality } from '../families/family.js';
import { SCHEDULER_NAMES } from '../schedulers/index.js';
import { ApiError, describeValue, quoteList, shortened } from './errors.js';
import {
  DALL_E_PROMPT_LIMITS,
  DEFAULT_RESPONSE_FORMAT,
  dialectOf,
  dialectWithoutModel,
  echoedQuality,
  qualityTier,
  REQUEST_QUALITIES,
  RESPONSE_FORMATS,
  type Dialect,
  type GptImageQuality,
  type ResponseFormat,
} from './dialects.js';

/**
 * The wire format, declared once: the generations request as a zod schema (OpenAI's fields, the
 * gpt-image fields, and our extensions), the response and error bodies as types. Validation failures
 * become OpenAI's error codes and message patterns, so clients and their logs read them as usual.
 */

/** gpt-image's limit; CLIP-based models read only the first 77 tokens of it, T5 the first 256/512. */
export const MAX_PROMPT_LENGTH = 32000;
const MAX_IMAGES = 10;
const MIN_STRENGTH = 0.01;

/** An integer field whose invalid_type errors say "integer" (z.int() reports plain "number"). */
const integer = (min: number, max: number) => z.number().multipleOf(1).min(min).max(max);

const nonEmptyText = z.string().min(1).max(MAX_PROMPT_LENGTH);

/** The formats the encoder writes (runtime/types.ts holds the one table). */
const OUTPUT_FORMATS = Object.keys(IMAGE_FORMATS) as [OutputFormat, ...OutputFormat[]];

/**
 * OpenAI's fields for what this server cannot make, each refused by name with what to do instead (as an
 * unknown field it would read as a typo): GIF frames and SVG authoring (output_format 'gif' and 'svg',
 * which its enum refuses), and an edit's markup overlay, a file in a form (http/uploads.ts).
 */
export const UNSUPPORTED_FIELDS = {
  frame_count: "Unsupported parameter: 'frame_count' goes with output_format 'gif', and this server makes still pictures only (png, jpeg or webp).",
  frame_duration_ms: "Unsupported parameter: 'frame_duration_ms' goes with output_format 'gif', and this server makes still pictures only (png, jpeg or webp).",
  svg: "Unsupported parameter: 'svg' goes with output_format 'svg', and this server draws pixels only (png, jpeg or webp).",
  markup: "Unsupported parameter: 'markup': this server's models read no overlay that guides an edit. Make the area to redraw fully transparent in 'mask' instead.",
} as const;

/** A field of UNSUPPORTED_FIELDS: any value is refused with its message. */
const unsupported = (field: keyof typeof UNSUPPORTED_FIELDS) =>
  z
    .unknown()
    .refine(() => false, { message: UNSUPPORTED_FIELDS[field], params: { code: 'unsupported_parameter' } })
    .optional();

/**
 * Every field of the three image requests, declared once; each route's schema picks its own below. The
 * defaults here apply to all of them (a variation has no `style`, yet its request reads as vivid).
 */
const requestFields = z.strictObject({
  /**
   * Required unless the parser has a default; its dialect (dialects.ts) sets defaults below. As long as
   * a folder name may be: it goes into every log line of the request.
   */
  model: z.string().min(1).max(255),
  /** Variations have none: they run with the empty prompt. Generations and edits require one. */
  prompt: z.string().max(MAX_PROMPT_LENGTH).default(''),
  n: integer(1, MAX_IMAGES).default(1),
  /** "WxH" or "auto" (the model's default); checked against the model's sizes by the service. Logged, so bounded. */
  size: z.string().max(32).optional(),
  /** A step tier (dialects.ts qualityTier). */
  quality: z.enum(REQUEST_QUALITIES).optional(),
  style: z.enum(STYLES).default('vivid'),
  /** Omitted: the dialect's default. */
  response_format: z.enum(RESPONSE_FORMATS).optional(),
  /** Accepted for compatibility; never stored or logged. */
  user: z.string().optional(),
  /**
   * OpenAI's successor of `user` (openai-node 7), at most 128 characters there: never stored or logged,
   * and echoed in gpt-image answers as OpenAI's are (the effective one: this, else `user`).
   */
  safety_identifier: z.string().max(128).optional(),
  output_format: z.enum(OUTPUT_FORMATS).default('png'),
  frame_count: unsupported('frame_count'),
  frame_duration_ms: unsupported('frame_duration_ms'),
  svg: unsupported('svg'),
  markup: unsupported('markup'),
  /** gpt-image's planning effort beside quality: a diffusion model plans nothing apart from its steps, so accepted and ignored. */
  complexity: z.enum(['low', 'medium', 'high']).optional(),
  output_compression: integer(0, 100).optional(),
  background: z
    .enum(['auto', 'opaque', 'transparent'])
    .refine((b) => b !== 'transparent', {
      message:
        "Unsupported value: 'background' does not support 'transparent' with this server: its models cannot draw transparency. Supported values are: 'opaque' and 'auto'.",
      params: { code: 'unsupported_value' },
    })
    .optional(),
  /** No moderation runs locally; both values are accepted. */
  moderation: z.enum(['auto', 'low']).optional(),
  /** Server-sent events instead of one JSON answer (generations and edits; see ImageStreamEvent). */
  stream: z.boolean().optional(),
  /** Streaming: previews per image before it is done; fewer come when the image takes few steps. */
  partial_images: integer(0, 3).optional(),
  /** Streaming (extension): also send `imagegen.progress` events, for user interfaces. */
  stream_progress: z.boolean().optional(),
  // Extensions: image i of a request uses seed + i.
  /** -1 is a random seed too, as in A1111 and ComfyUI, whose users send it. */
  seed: integer(-1, MAX_SEED).optional(),
  steps: integer(1, MAX_STEPS).optional(),
  guidance_scale: z.number().min(0).max(MAX_GUIDANCE_SCALE).optional(),
  negative_prompt: z.string().max(MAX_PROMPT_LENGTH).optional(),
  scheduler: z.enum(SCHEDULER_NAMES).optional(),
  /** The noise generator: `torch` reproduces diffusers' pictures for a seed (torch.Generator("cpu")). */
  rng: z.enum(NOISE_KINDS).optional(),
  /** Edits: OpenAI's detail-keeping hint for gpt-image; the diffusion models have no such knob, so accepted and ignored. */
  input_fidelity: z.enum(['high', 'low']).optional(),
  /**
   * Edits and variations (extension): how much of the schedule runs from the input image, diffusers'
   * strength. At least 0.01, so that raising the steps to leave one to run stays within MAX_STEPS.
   */
  strength: z.number().min(MIN_STRENGTH).max(1).optional(),
});

const generationRequestSchema = requestFields.omit({ input_fidelity: true, strength: true, markup: true }).extend({ prompt: nonEmptyText });

/**
 * OpenAI's edit fields, `style` kept as the extension it is for gpt-image names. `moderation` is one of
 * its JSON edit's fields (EditImageBodyJsonParam), not of the SDKs' form: taken in both, as nothing
 * moderates here.
 */
const editRequestSchema = requestFields.extend({ prompt: nonEmptyText });

/** dall-e-2's variation fields, plus the extensions that make sense without a prompt (no streaming: OpenAI has none for variations). */
const variationRequestSchema = requestFields.pick({
  model: true,
  n: true,
  size: true,
  response_format: true,
  user: true,
  seed: true,
  steps: true,
  guidance_scale: true,
  scheduler: true,
  rng: true,
  strength: true,
});

/** Each dall-e name's prompt, checked by the same zod rule (and so in the same words) as every other field. */
const dallELimitSchemas = new Map(Object.entries(DALL_E_PROMPT_LIMITS).map(([name, limit]) => [name, z.object({ prompt: z.string().max(limit) })]));

/** The schema of each route's fields (the images themselves travel beside them, see src/http/uploads.ts). */
const REQUEST_SCHEMAS = { generation: generationRequestSchema, edit: editRequestSchema, variation: variationRequestSchema } as const;
export type RequestKind = keyof typeof REQUEST_SCHEMAS;

/** The fields each kind of request takes, by name (docs/api.md's field tables list them: test/api-docs.test.ts). */
export const REQUEST_FIELD_NAMES: Record<RequestKind, ReadonlySet<string>> = {
  generation: new Set(Object.keys(generationRequestSchema.shape)),
  edit: new Set(Object.keys(editRequestSchema.shape)),
  variation: new Set(Object.keys(variationRequestSchema.shape)),
};

/** Whether `name` is a field of a `kind` request (a form's text part, as the SDKs send it). */
export function isRequestField(kind: RequestKind, name: string): boolean {
  return REQUEST_FIELD_NAMES[kind].has(name);
}

/** Free text that OpenAI's SDKs type as a plain string (no null): 'null' there is the caller's text. */
const LITERAL_TEXT_FIELDS: readonly string[] = ['prompt', 'user', 'negative_prompt'];

/**
 * Whether a form's text part stands for null, that is for the field omitted, as null does in JSON:
 * openai-node types most fields as nullable but refuses a null in a form, telling its caller to send the
 * text 'null' instead.
 */
export function meansNull(kind: RequestKind, name: string, value: unknown): boolean {
  return value === 'null' && isRequestField(kind, name) && !LITERAL_TEXT_FIELDS.includes(name);
}

type RequestFields = z.output<typeof requestFields>;

/**
 * A request as the service reads it, whichever route it came by: the model named (or the default), its
 * dialect's defaults applied. A variation's prompt is empty.
 */
export type GenerationRequest = Omit<RequestFields, 'quality' | 'response_format'> & {
  dialect: Dialect;
  quality: Quality;
  /** What a gpt-image answer says of the quality (dialects.ts echoedQuality). */
  echoed_quality: GptImageQuality;
  response_format: ResponseFormat;
};

export interface ImageObject {
  url?: string;
  b64_json?: string;
  /** Extension: reproduces this image alone with the same prompt and settings. */
  seed: number;
}

/**
 * Token counts of a gpt-image response (src/service/gpt-image-fields.ts says what they count here).
 * Input image tokens count the input image of edits and variations; generations have none.
 */
export interface ImageUsage {
  input_tokens: number;
  input_tokens_details: { text_tokens: number; image_tokens: number };
  output_tokens: number;
  output_tokens_details: { text_tokens: number; image_tokens: number };
  total_tokens: number;
}

/** What a gpt-image response adds: the settings used. */
export interface GptImageResponseFields {
  background: 'opaque';
  output_format: OutputFormat;
  quality: GptImageQuality;
  /** WxH, any (openai-node 7 types it as any string, as gpt-image-2 draws any size). */
  size: string;
  usage: ImageUsage;
  /** The request's safety_identifier, else its user, when either is given (not empty). */
  safety_identifier?: string;
}

export interface ImagesResponse extends Partial<GptImageResponseFields> {
  created: number;
  data: ImageObject[];
}

/** The two streamed routes' event names: `image_generation.*` for generations, `image_edit.*` for edits. */
export type StreamPrefix = 'image_generation' | 'image_edit';

/** What every streamed image event carries besides its picture: the settings it was made with. */
export interface StreamedImageFields {
  b64_json: string;
  created_at: number;
  size: string;
  quality: GptImageQuality;
  background: 'opaque';
  output_format: OutputFormat;
  /** Extension, as in ImageObject: reproduces the image alone. */
  seed: number;
}

/** A preview of an image while it is denoised (openai-node's ImageGenPartialImageEvent / ImageEditPartialImageEvent). */
export interface ImagePartialEvent extends StreamedImageFields {
  type: `${StreamPrefix}.partial_image`;
  partial_image_index: number;
}

/** A finished image, one event per image (openai-node's ImageGenCompletedEvent / ImageEditCompletedEvent). */
export interface ImageCompletedEvent extends StreamedImageFields {
  type: `${StreamPrefix}.completed`;
  usage: ImageUsage;
  safety_identifier?: string;
}

/**
 * Extension, sent only when the request has `stream_progress: true`: while the request waits,
 * `queued_ahead` is the number of batches before it; while it runs, `step` of `steps` are done.
 */
export interface ImageProgressEvent {
  type: 'imagegen.progress';
  queued_ahead?: number;
  step?: number;
  steps?: number;
}

export type ImageStreamEvent = ImagePartialEvent | ImageCompletedEvent | ImageProgressEvent;

export interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

export interface ModelObject {
  id: string;
  object: 'model';
  created: number;
  owned_by: string;
  /** Extensions: the sizes a request may name under this id (`auto` first under gpt-image names) and the one it gets when it names none. */
  sizes: string[];
  default_size: string;
  /** Extension: the values `quality` takes under this id (the gpt-image names take only their OpenAI model's). */
  qualities: string[];
  /** Extensions: what the model can do here (`text-to-image`, `image-to-image` and `inpainting` where it can edit, `previews` for streamed partial images), and the samplers `scheduler` takes. */
  capabilities: string[];
  schedulers: string[];
  /** Extension: true for the model that requests naming none get (DEFAULT_MODEL), so a client can offer it first. */
  default: boolean;
}

export interface ModelList {
  object: 'list';
  data: ModelObject[];
}

/** The schema of a field without its optional/default wrappers. */
function fieldSchema(key: string): z.ZodType | undefined {
  let field: z.ZodType | undefined = requestFields.shape[key as keyof typeof requestFields.shape];
  while (field && 'unwrap' in field && typeof field.unwrap === 'function') field = field.unwrap() as z.ZodType;
  return field;
}

function isIntegerField(key: string): boolean {
  const field = fieldSchema(key);
  return field instanceof z.ZodNumber && Boolean(field.isInt);
}

const NUMBER = /^\s*-?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*$/i;

/**
 * A multipart form's text values as the JSON body would carry them: the SDKs send numbers and booleans
 * as strings (`n` arrives as "2"). A string that is no number stays one, so zod's message says what came.
 */
function fromForm(fields: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(fields).map(([key, value]) => {
      if (typeof value !== 'string') return [key, value];
      const field = fieldSchema(key);
      if (field instanceof z.ZodNumber && NUMBER.test(value)) return [key, Number(value)];
      // Any case: Python's str(True), which requests and httpx send for a bool in `data`, is 'True'.
      if (field instanceof z.ZodBoolean && /^(true|false)$/i.test(value)) return [key, value.toLowerCase() === 'true'];
      return [key, value];
    }),
  );
}

const EXPECTED: Record<string, string> = { string: 'a string', number: 'a number', boolean: 'a boolean', object: 'an object' };

/**
 * What a form's text that is no number or boolean is called in a 400: every form value is a string, so
 * "got a string" says nothing to the caller; the text itself, and how to write one, does.
 */
function formText(expected: string, text: string): string {
  const spelling = expected === 'a boolean' ? 'true or false' : expected === 'an integer' ? 'digits only, e.g. 2' : 'a number, e.g. 0.5';
  return `the text '${shortened(text)}' instead (a multipart form sends it as ${spelling})`;
}

/** One zod issue in OpenAI's words; `param` is the field's name; `form`: the value came as a form's text. */
function toApiError(issue: z.core.$ZodIssue, form = false): ApiError {
  const param = issue.path.map(String).join('.');
  const kind = isIntegerField(param) ? 'integer' : 'decimal';
  switch (issue.code) {
    case 'unrecognized_keys':
      return ApiError.unknownParameter(issue.keys[0]);
    case 'invalid_type': {
      if (issue.input === undefined) {
        return ApiError.missing(param);
      }
      const expected = kind === 'integer' ? 'an integer' : (EXPECTED[issue.expected] ?? issue.expected);
      const got = form && typeof issue.input === 'string' ? formText(expected, issue.input) : `${describeValue(issue.input)} instead`;
      return ApiError.invalid(param, 'invalid_type', `Invalid type for '${param}': expected ${expected}, but got ${got}.`);
    }
    case 'not_multiple_of':
      return ApiError.invalid(param, 'invalid_type', `Invalid type for '${param}': expected an integer, but got a decimal number instead.`);
    case 'too_big':
    case 'too_small': {
      const above = issue.code === 'too_big';
      const limit = above ? issue.maximum : issue.minimum;
      if (issue.origin === 'string') {
        // In characters (code points), as zod's check and OpenAI count them: an emoji is one, two in a JavaScript string's length.
        const got = z.core.util.codePointLength(String(issue.input ?? ''));
        if (got === 0) {
          return ApiError.invalid(param, 'empty_string', `Invalid '${param}': empty string. Expected a string with minimum length ${limit}, but got an empty string instead.`);
        }
        return ApiError.invalid(
          param,
          `string_${above ? 'above_max' : 'below_min'}_length`,
          `Invalid '${param}': string too ${above ? 'long' : 'short'}. Expected a string with ${above ? 'maximum' : 'minimum'} length ${limit}, but got a string with length ${got} instead.`,
        );
      }
      return ApiError.invalid(
        param,
        `${kind}_${above ? 'above_max' : 'below_min'}_value`,
        `Invalid '${param}': ${kind} ${above ? 'above maximum' : 'below minimum'} value. Expected a value ${above ? '<=' : '>='} ${limit}, but got ${issue.input} instead.`,
      );
    }
    case 'invalid_value':
      // ["hd"] or 1 is no value of the list at all: quoted as text, ["hd"] read "Invalid value: 'hd'" beside a list that has 'hd'.
      if (typeof issue.input !== 'string') {
        return ApiError.invalid(param, 'invalid_type', `Invalid type for '${param}': expected one of ${quoteList(issue.values, 'or')}, but got ${describeValue(issue.input)} instead.`);
      }
      return ApiError.invalid(param, 'invalid_value', `Invalid value: '${issue.input}'. Supported values are: ${quoteList(issue.values)}.`);
    case 'custom':
      return ApiError.invalid(param, (issue.params?.code as string | undefined) ?? 'invalid_value', issue.message);
    default:
      return ApiError.invalid(param || null, 'invalid_value', `Invalid '${param}': ${issue.message}.`);
  }
}

/** Unknown fields first (usually a typo that explains the rest), then missing ones, then field order. */
function rank(issue: z.core.$ZodIssue): number {
  if (issue.code === 'unrecognized_keys') return 0;
  if (issue.code === 'invalid_type' && issue.input === undefined) return 1;
  return 2;
}

export interface ParseOptions {
  /** The model of requests that name none; the CLI names its model itself, so only the HTTP routes pass one. */
  defaultModel?: string;
  /** The fields came as a multipart form's text values (strings), not as JSON. */
  form?: boolean;
}

/**
 * Validates the fields of a generations, edits or variations request. `null` means "omitted"
 * (openai-python sends explicit None as null). Throws the ApiError of the most telling problem.
 */
export function parseImageRequest(kind: RequestKind, body: unknown, { defaultModel, form = false }: ParseOptions = {}): GenerationRequest {
  // No body at all reads as an empty object, so the answer names the missing fields.
  const input = body === undefined ? {} : body;
  if (typeof input !== 'object' || input === null || Array.isArray(input)) {
    throw ApiError.invalid(null, 'invalid_type', `Invalid body: expected a JSON object, but got ${describeValue(input)} instead.`);
  }
  const given = Object.fromEntries(Object.entries(input).filter(([, value]) => value !== null));
  const present = form ? fromForm(given) : given;
  const named = present.model !== undefined;
  if (defaultModel !== undefined) present.model ??= defaultModel;
  const checked = REQUEST_SCHEMAS[kind].safeParse(present, { reportInput: true });
  if (!checked.success) throw toApiError([...checked.error.issues].sort((a, b) => rank(a) - rank(b))[0], form);
  // Each route's fields passed its own schema; this fills the defaults of those it lacks (a variation's style).
  const { model, quality, response_format, ...fields } = requestFields.parse(checked.data);
  // By the name the request used: one without a model keeps the server's limits even when DEFAULT_MODEL is a dall-e name.
  const dallELimits = named ? dallELimitSchemas.get(model)?.safeParse(fields, { reportInput: true }) : undefined;
  if (dallELimits?.success === false) throw toApiError(dallELimits.error.issues[0]);
  // The fields as sent, not as parsed: the parse fills in defaults (output_format png) the client never sent.
  const dialect = named ? dialectOf(model) : dialectWithoutModel(kind, present);
  const tier = qualityTier(quality, model);
  const request: GenerationRequest = {
    ...fields,
    seed: fields.seed === -1 ? undefined : fields.seed,
    model,
    dialect,
    quality: tier,
    echoed_quality: echoedQuality(quality, tier),
    response_format: response_format ?? DEFAULT_RESPONSE_FORMAT[dialect],
  };
  if (request.stream) {
    // Streamed images travel in the events, as OpenAI's do.
    if (response_format === 'url') {
      throw ApiError.invalid('response_format', 'unsupported_value', "Unsupported value: 'response_format' 'url' cannot be streamed: streamed images arrive as b64_json in the events. Omit it or set stream to false.");
    }
    request.response_format = 'b64_json';
  } else if (request.stream_progress) {
    throw ApiError.invalid('stream_progress', 'unsupported_value', "Unsupported value: 'stream_progress' needs 'stream': true.");
  }
  if (request.output_compression !== undefined && request.output_compression < 100 && request.output_format === 'png') {
    throw ApiError.invalid(
      'output_compression',
      'unsupported_value',
      "Unsupported value: 'output_compression' below 100 needs output_format 'jpeg' or 'webp'; PNG is lossless.",
    );
  }
  return request;
}

/** A generations request body as the CLI sends it (it names its model itself). */
export function parseGenerationRequest(body: unknown): GenerationRequest {
  return parseImageRequest('generation', body);
}
