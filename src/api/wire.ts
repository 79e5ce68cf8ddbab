import { z } from 'zod';
import { MAX_SEED } from '../engine/random.js';
import { STYLES, type Quality } from '../models/presets.js';
import { SCHEDULER_NAMES } from '../schedulers/index.js';
import { ApiError, quoteList } from './errors.js';

/**
 * The wire format, declared once: the generations request as a zod schema (OpenAI's fields, the
 * gpt-image fields, and our extensions), the response and error bodies as types. Validation failures
 * become OpenAI's error codes and message patterns, so clients and their logs read them as usual.
 */

/** gpt-image's limit; CLIP-based models read only the first 77 tokens of it, T5 the first 256/512. */
export const MAX_PROMPT_LENGTH = 32000;
const MAX_IMAGES = 10;
const MAX_STEPS = 150;
const MAX_GUIDANCE_SCALE = 30;

/** An integer field whose invalid_type errors say "integer" (z.int() reports plain "number"). */
const integer = (min: number, max: number) => z.number().multipleOf(1).min(min).max(max);

const nonEmptyText = z.string().min(1).max(MAX_PROMPT_LENGTH);

const generationRequestSchema = z.strictObject({
  model: z.string().min(1),
  prompt: nonEmptyText,
  n: integer(1, MAX_IMAGES).default(1),
  /** "WxH" or "auto" (the model's default); checked against the model's sizes by the service. */
  size: z.string().optional(),
  /** standard|hd (dall-e-3); gpt-image's low|medium|auto count as standard, high as hd. */
  quality: z
    .enum(['standard', 'hd', 'low', 'medium', 'high', 'auto'])
    .default('standard')
    .transform((q): Quality => (q === 'hd' || q === 'high' ? 'hd' : 'standard')),
  style: z.enum(STYLES).default('vivid'),
  response_format: z.enum(['url', 'b64_json']).default('url'),
  /** Accepted for compatibility; never stored or logged. */
  user: z.string().optional(),
  output_format: z.enum(['png', 'jpeg', 'webp']).default('png'),
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
  stream: z
    .boolean()
    .refine((s) => !s, {
      message: "Unsupported value: 'stream' does not support true with this server. Omit it or set it to false.",
      params: { code: 'unsupported_value' },
    })
    .optional(),
  /** Only meaningful with stream, which is always false here. */
  partial_images: integer(0, 3).optional(),
  // Extensions: image i of a request uses seed + i.
  seed: integer(0, MAX_SEED).optional(),
  steps: integer(1, MAX_STEPS).optional(),
  guidance_scale: z.number().min(0).max(MAX_GUIDANCE_SCALE).optional(),
  negative_prompt: z.string().max(MAX_PROMPT_LENGTH).optional(),
  scheduler: z.enum(SCHEDULER_NAMES).optional(),
});

export type GenerationRequest = z.output<typeof generationRequestSchema>;

export interface ImageObject {
  url?: string;
  b64_json?: string;
  /** Extension: reproduces this image alone with the same prompt and settings. */
  seed: number;
}

export interface ImagesResponse {
  created: number;
  data: ImageObject[];
}

export interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

export interface ModelObject {
  id: string;
  object: 'model';
  created: number;
  owned_by: string;
  /** Extensions: the sizes the model accepts and the one used when a request names none. */
  sizes: string[];
  default_size: string;
}

export interface ModelList {
  object: 'list';
  data: ModelObject[];
}

function isIntegerField(key: string): boolean {
  let field: z.ZodType | undefined = generationRequestSchema.shape[key as keyof typeof generationRequestSchema.shape];
  while (field && 'unwrap' in field && typeof field.unwrap === 'function') field = field.unwrap() as z.ZodType;
  return field instanceof z.ZodNumber && Boolean(field.isInt);
}

function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'number') return Number.isInteger(value) ? 'an integer' : 'a decimal number';
  if (typeof value === 'object') return 'an object';
  return `a ${typeof value}`;
}

const EXPECTED: Record<string, string> = { string: 'a string', number: 'a number', boolean: 'a boolean', object: 'an object' };

/** One zod issue in OpenAI's words; `param` is the field's name. */
function toApiError(issue: z.core.$ZodIssue): ApiError {
  const param = issue.path.map(String).join('.');
  const kind = isIntegerField(param) ? 'integer' : 'decimal';
  switch (issue.code) {
    case 'unrecognized_keys':
      return ApiError.invalid(issue.keys[0], 'unknown_parameter', `Unknown parameter: '${issue.keys[0]}'.`);
    case 'invalid_type': {
      if (issue.input === undefined) {
        return ApiError.invalid(param, 'missing_required_parameter', `Missing required parameter: '${param}'.`);
      }
      const expected = kind === 'integer' ? 'an integer' : (EXPECTED[issue.expected] ?? issue.expected);
      return ApiError.invalid(param, 'invalid_type', `Invalid type for '${param}': expected ${expected}, but got ${describeValue(issue.input)} instead.`);
    }
    case 'not_multiple_of':
      return ApiError.invalid(param, 'invalid_type', `Invalid type for '${param}': expected an integer, but got a decimal number instead.`);
    case 'too_big':
    case 'too_small': {
      const above = issue.code === 'too_big';
      const limit = above ? issue.maximum : issue.minimum;
      if (issue.origin === 'string') {
        const got = String(issue.input ?? '').length;
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
      return ApiError.invalid(param, 'invalid_value', `Invalid value: '${String(issue.input)}'. Supported values are: ${quoteList(issue.values)}.`);
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

/**
 * Validates a generations request body. `null` means "omitted" (openai-python sends explicit None as
 * null). Throws the ApiError of the most telling problem.
 */
export function parseGenerationRequest(body: unknown): GenerationRequest {
  // No body at all reads as an empty object, so the answer names the missing fields.
  const input = body === undefined ? {} : body;
  if (typeof input !== 'object' || input === null || Array.isArray(input)) {
    throw ApiError.invalid(null, 'invalid_type', `Invalid body: expected a JSON object, but got ${describeValue(input)} instead.`);
  }
  const present = Object.fromEntries(Object.entries(input).filter(([, value]) => value !== null));
  const result = generationRequestSchema.safeParse(present, { reportInput: true });
  if (!result.success) throw toApiError([...result.error.issues].sort((a, b) => rank(a) - rank(b))[0]);

  const request = result.data;
  if (request.output_compression !== undefined && request.output_compression < 100 && request.output_format === 'png') {
    throw ApiError.invalid(
      'output_compression',
      'unsupported_value',
      "Unsupported value: 'output_compression' below 100 needs output_format 'jpeg' or 'webp'; PNG is lossless.",
    );
  }
  return request;
}
