import type { FastifyRequest } from 'fastify';

/**
 * Whether the request carries the header `name` (lower case) more than once. Node keeps only the first
 * of a Host or an Authorization header; a proxy in front may have read the other, so such a request is
 * refused rather than read one way here and another there.
 */
export function sentMoreThanOnce(request: FastifyRequest, name: string): boolean {
  // rawHeaders alternates names and values, as they came.
  return request.raw.rawHeaders.filter((header, i) => i % 2 === 0 && header.toLowerCase() === name).length > 1;
}

/**
 * Whether the request says it sends a form (multipart/form-data), by its Content-Type alone: what
 * @fastify/multipart parses (on the routes that take uploads), known before the body is read, where
 * request.isMultipart() is known only once Fastify has picked the body's parser.
 */
export function sendsForm(request: FastifyRequest): boolean {
  return /^multipart\/form-data\b/i.test(request.headers['content-type'] ?? '');
}
