import fastifyCors from '@fastify/cors';
import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';

/**
 * CORS for web pages on other origins (CORS_ORIGINS): @fastify/cors answers their preflights before the
 * API key check (browsers send no Authorization on a preflight) and marks the answers of every route,
 * image files included, as readable by them. Without origins nothing is registered: browsers then refuse
 * cross-origin calls, as they should for a server nobody opened to them.
 */

export interface CorsOptions {
  /** Origins as browsers send them, or "*" for any. */
  origins: string[];
}

/** Headers a page's script may read: the SDKs take the request id and retry hints from them. */
const RATE_HEADERS = ['requests', 'images'].flatMap((measure) => ['limit', 'remaining', 'reset'].map((what) => `x-ratelimit-${what}-${measure}`));
const EXPOSED_HEADERS = ['x-request-id', 'openai-processing-ms', 'retry-after', 'x-should-retry', ...RATE_HEADERS];

/** Browsers may reuse a preflight's answer this long (seconds) before asking again. */
const PREFLIGHT_MAX_AGE = 600;

async function corsPlugin(app: FastifyInstance, { origins }: CorsOptions): Promise<void> {
  if (origins.length === 0) return;
  const any = origins.includes('*');
  const options = {
    // Any other origin (and a request without one) gets no CORS headers at all, preflights included.
    origin: (origin: string | undefined, callback: (error: null, allow: string | false) => void) =>
      callback(null, any ? '*' : origin !== undefined && origins.includes(origin) ? origin : false),
    methods: ['GET', 'HEAD', 'POST'],
    // allowedHeaders left unset: a preflight's requested headers are allowed, Authorization and
    // Content-Type as much as the X-Stainless-* headers the OpenAI SDKs add. Keys travel in a header,
    // never in cookies, so credentials stay off.
    exposedHeaders: EXPOSED_HEADERS,
    maxAge: PREFLIGHT_MAX_AGE,
  };
  await app.register(fastifyCors, {
    // Only an OPTIONS that names the method it asks for is a preflight (Fetch's CORS-preflight request).
    // Any other gets the 405 (or 404) every OPTIONS gets, in OpenAI's shape: as a preflight, @fastify/cors
    // answered it with a plain-text 400 'Invalid Preflight Request'.
    delegator: (request, callback) => callback(null, { ...options, preflight: request.headers['access-control-request-method'] !== undefined }),
  });
}

export const cors = fp(corsPlugin, { name: 'cors' });
