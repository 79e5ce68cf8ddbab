import type { FastifyRequest } from 'fastify';
import { isGptImageSize } from '../api/dialects.js';

/**
 * The size an answer repeats, as the client's SDK can read it. openai-python before 3 (2.54.0 was run)
 * types a JSON answer's `size` as OpenAI's three gpt-image sizes and a streamed event's as those or
 * `auto`, and with `_strict_response_validation=True` it refuses the whole answer
 * (APIResponseValidationError) over any other size, such as the 512x512 a 512-pixel model draws for
 * `auto`. 3.x (3.22.1 was run) types it as any WxH, as openai-node 7 does, and every other client reads
 * it as it is. Its headers say which SDK sent the request (every openai-python release sends
 * X-Stainless-*).
 *
 * `size` as the request's SDK reads it, or undefined where it cannot: the JSON answer then leaves
 * `size` out (optional there) and an event says `auto` (required there).
 */
export function readableSize(request: FastifyRequest, size: string): string | undefined {
  return !typesSizeAsEnum(request) || isGptImageSize(size) ? size : undefined;
}

function typesSizeAsEnum(request: FastifyRequest): boolean {
  const version = request.headers['x-stainless-package-version'];
  return request.headers['x-stainless-lang'] === 'python' && typeof version === 'string' && Number.parseInt(version, 10) < 3;
}
