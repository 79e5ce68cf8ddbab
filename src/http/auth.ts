import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { ApiError } from '../api/errors.js';

/**
 * Bearer API keys, as OpenAI checks them. Routes marked `config: { public: true }` (image files, so a
 * plain <img> can load them, and /health) and unknown URLs need no key. Without configured keys the server accepts
 * everyone; config.ts only allows that on loopback.
 */

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Reachable without an API key. */
    public?: boolean;
  }
}

export interface AuthOptions {
  apiKeys: string[];
}

const CHALLENGE = { 'www-authenticate': 'Bearer realm="imagegen"' };

// Comparing fixed-size digests keeps the comparison's time independent of the key and of its length.
const digest = (key: string) => createHash('sha256').update(key).digest();

/** OpenAI's way of naming a wrong key without echoing it: its first and last few characters. */
function mask(key: string): string {
  return key.length > 10 ? `${key.slice(0, 3)}${'*'.repeat(key.length - 7)}${key.slice(-4)}` : '*'.repeat(key.length);
}

async function authPlugin(app: FastifyInstance, options: AuthOptions): Promise<void> {
  if (options.apiKeys.length === 0) return;
  const accepted = options.apiKeys.map(digest);

  app.addHook('onRequest', async (request) => {
    // Unknown URLs answer 404 to everyone: a wrong base URL is then told apart from a wrong key.
    if (request.routeOptions.config.public || request.is404) return;
    const key = /^Bearer\s+(\S+)\s*$/i.exec(request.headers.authorization ?? '')?.[1];
    if (!key) {
      throw new ApiError(
        401,
        "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        { headers: CHALLENGE },
      );
    }
    const sent = digest(key);
    // No early exit: every configured key is compared.
    const valid = accepted.reduce((found, candidate) => timingSafeEqual(candidate, sent) || found, false);
    if (!valid) {
      throw new ApiError(401, `Incorrect API key provided: ${mask(key)}.`, { code: 'invalid_api_key', headers: CHALLENGE });
    }
  });
}

export const auth = fp(authPlugin, { name: 'auth' });
