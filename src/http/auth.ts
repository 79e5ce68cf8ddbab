import type { FastifyInstance, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { bearerKey } from '../api/bearer.js';
import { ApiError } from '../api/errors.js';
import { KeyRing, type ApiKey } from './keys.js';
import { localClientsOnly } from './local-only.js';
import { sentMoreThanOnce } from './raw-headers.js';

/**
 * Bearer API keys, as OpenAI checks them. Routes marked `config: { public: true }` (image files, so a
 * plain <img> can load them, and /health) and unknown URLs need no key. Without configured keys the server accepts
 * every program on its own machine and nothing else (config.ts only allows that on loopback; local-only.ts
 * refuses what reaches a loopback server from elsewhere).
 *
 * The key is checked in onRequest, before a byte of the body is read: a refusal is answered at once, and
 * what the client still sends of its body is dropped as it comes, within bounds (connections.ts).
 * The accepted key's label (never the key) goes on every log line of the request.
 */

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Reachable without an API key. */
    public?: boolean;
  }
  interface FastifyRequest {
    /** The key the request was made with (null without keys or on public routes): its label and limits. */
    apiKey: Omit<ApiKey, 'key'> | null;
  }
}

/**
 * Who a request is for: its API key, by label; none on a server without keys, which has one client.
 * What queue fairness (image-routes.ts queueClient) and the memory shares (memory-share.ts) count by.
 */
export const clientOf = (request: FastifyRequest): string | undefined => request.apiKey?.label;

export interface AuthOptions {
  apiKeys: string[];
  /** API_KEYS_FILE: re-read when it changes and on SIGHUP. */
  apiKeysFile?: string;
  /** CORS_ORIGINS: the pages a server without keys answers besides its own machine's (local-only.ts). */
  corsOrigins: readonly string[];
}

const REFUSAL_HEADERS = { 'www-authenticate': 'Bearer realm="imagegen"' };

/** OpenAI's way of naming a wrong key without echoing it: its first and last few characters. */
function mask(key: string): string {
  return key.length > 10 ? `${key.slice(0, 3)}${'*'.repeat(key.length - 7)}${key.slice(-4)}` : '*'.repeat(key.length);
}

async function authPlugin(app: FastifyInstance, options: AuthOptions): Promise<void> {
  app.decorateRequest('apiKey', null);
  const keys = await KeyRing.open({ ...options, logger: app.log });
  // Handled with keys or without: SIGHUP's default action would end the server, requests in flight and all.
  const reload = () => (keys.enabled ? void keys.reload() : app.log.info('SIGHUP: there are no API keys to reload'));
  process.on('SIGHUP', reload);
  app.addHook('onClose', async () => {
    process.off('SIGHUP', reload);
    keys.close();
  });
  if (!keys.enabled) {
    app.addHook('onRequest', localClientsOnly(options.corsOrigins));
    return;
  }

  app.addHook('onRequest', async (request, reply) => {
    // Unknown URLs answer 404 to everyone: a wrong base URL is then told apart from a wrong key.
    if (request.routeOptions.config.public || request.is404) return;
    // Browsers send CORS preflights without the key. OPTIONS reaches no resource: cors.ts answers the
    // preflights of allowed origins, every other OPTIONS gets a 405.
    if (request.method === 'OPTIONS') return;
    if (sentMoreThanOnce(request, 'authorization')) {
      throw new ApiError(400, 'The request has more than one Authorization header: send the key in one.', { code: 'invalid_authorization_header' });
    }
    const sent = bearerKey(request.headers.authorization);
    if (!sent) {
      // OpenAI also takes the key as a Basic password (`curl -u :KEY`). Not here: a browser given Basic
      // credentials once sends them with every request to the server, a multipart form posted by any page
      // too (no CORS preflight stops it), where a Bearer key goes only where code puts it.
      const basic = /^Basic\b/i.test(request.headers.authorization ?? '');
      const why = basic ? 'Basic auth is not accepted here (a browser would send it on any web page\'s behalf). ' : "You didn't provide an API key. ";
      const curl = basic ? " (with curl, -H 'Authorization: Bearer YOUR_KEY' rather than -u :YOUR_KEY)" : '';
      throw new ApiError(401, `${why}You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)${curl}.`, { headers: REFUSAL_HEADERS });
    }
    const found = keys.find(sent);
    if (!found) {
      throw new ApiError(401, `Incorrect API key provided: ${mask(sent)}.`, { code: 'invalid_api_key', headers: REFUSAL_HEADERS });
    }
    request.apiKey = { label: found.label, owner: found.owner, ...(found.limits && { limits: found.limits }) };
    request.log = reply.log = request.log.child({ apiKey: found.label });
  });
}

export const auth = fp(authPlugin, { name: 'auth' });
