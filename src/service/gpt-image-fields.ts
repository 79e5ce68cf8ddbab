import type { GenerationRequest, GptImageResponseFields, ImageUsage } from '../api/wire.js';

/**
 * What a gpt-image response adds to the images: the settings they were made with, and `usage`.
 *
 * Usage here counts work, not money. Input: the prompt's tokens by the model's own tokenizer
 * (prompt-tokens.ts). Output: one image token per 2x2 patch of latent pixels, i.e. per 16x16 pixels
 * with the usual 8x VAE, for each image: what a FLUX transformer takes as one token, and for every
 * model a figure that grows with the pixels drawn (a 1024x1024 image is 4096). Steps do not count. The
 * input picture of an edit or variation counts as input image tokens by the same rule, at the size it
 * was fitted to.
 */

/** Latent pixels along a side of one image token. */
const PATCH = 2;

export interface DrawnImages {
  width: number;
  height: number;
  count: number;
  /** Input pictures, each fitted to width x height: 1 for edits and variations, 0 for generations. */
  inputImages: number;
  /** Image pixels per latent pixel along a side (the VAE's scale factor). */
  vaeScale: number;
}

function imageUsage(textTokens: number, { width, height, count, inputImages, vaeScale }: DrawnImages): ImageUsage {
  const side = vaeScale * PATCH;
  const perImage = Math.ceil(width / side) * Math.ceil(height / side);
  const [inputTokens, outputTokens] = [inputImages * perImage, count * perImage];
  return {
    input_tokens: textTokens + inputTokens,
    input_tokens_details: { text_tokens: textTokens, image_tokens: inputTokens },
    output_tokens: outputTokens,
    output_tokens_details: { text_tokens: 0, image_tokens: outputTokens },
    total_tokens: textTokens + inputTokens + outputTokens,
  };
}

/**
 * The settings a gpt-image answer (and every streamed image event) repeats. The models draw no
 * transparency, so the background is always opaque.
 */
export function echoedSettings(request: GenerationRequest): Pick<GptImageResponseFields, 'background' | 'output_format' | 'quality'> {
  return { background: 'opaque', output_format: request.output_format, quality: request.echoed_quality };
}

/**
 * The safety identifier a gpt-image answer repeats, as OpenAI's do: the request's `safety_identifier`,
 * else its `user`, when either is given (not empty). Nothing else of it is kept.
 */
function safetyIdentifierOf(request: Pick<GenerationRequest, 'safety_identifier' | 'user'>): Pick<GptImageResponseFields, 'safety_identifier'> {
  const identifier = request.safety_identifier || request.user;
  return identifier ? { safety_identifier: identifier } : {};
}

/** The echoed settings, the size drawn (any WxH: openai-node 7 types it as a string), usage and the safety identifier. */
export function gptImageFields(request: GenerationRequest, textTokens: number, drawn: DrawnImages): GptImageResponseFields {
  return {
    ...echoedSettings(request),
    size: `${drawn.width}x${drawn.height}`,
    usage: imageUsage(textTokens, drawn),
    ...safetyIdentifierOf(request),
  };
}
