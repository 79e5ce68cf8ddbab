import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../api/errors.js';

/**
 * The playground page (web/, bundled by esbuild into dist/playground/ at `npm run build`): served at `/`
 * and at /playground/, without an API key (the page asks for one and sends it with its API calls, which
 * keep needing it). Everything it loads comes from this server: no CDN, so it works air-gapped, and its
 * Content-Security-Policy makes the browser refuse anything else.
 *
 * The files are read once at start (the bundle is a few tens of kB) and looked up by name in that map,
 * so no request path ever reaches the filesystem. Each is served with `Cache-Control: no-cache` and a
 * content-hash ETag: browsers keep it and revalidate (a 304 without the body), so a page never runs an
 * older bundle against an upgraded server, for one round trip to a server that is usually on the same host.
 */

/** Where `npm run build:playground` writes the bundle (the same from src/http and from dist/http). */
export const PLAYGROUND_DIR = fileURLToPath(new URL('../../dist/playground/', import.meta.url));
/** The page's own path; `/` serves the same page. */
const PLAYGROUND_PATH = '/playground/';

const CONTENT_TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.map': 'application/json; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
};

interface Asset {
  body: Buffer;
  contentType: string;
  etag: string;
}

export interface PlaygroundOptions {
  /** The built bundle's folder (default PLAYGROUND_DIR). */
  dir?: string;
  /**
   * Origins besides the server's own where image URLs point (PUBLIC_BASE_URL's, an S3 bucket's
   * presigned URLs'), so the page may load images from them.
   */
  imageOrigins?: readonly string[];
}

/** The bundle's files by name; empty when it has not been built. */
async function loadAssets(dir: string): Promise<Map<string, Asset>> {
  const names = await readdir(dir).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return [];
    throw err;
  });
  const assets = new Map<string, Asset>();
  for (const name of names) {
    const contentType = CONTENT_TYPES[path.extname(name)];
    if (!contentType) continue;
    const body = await readFile(path.join(dir, name));
    assets.set(name, { body, contentType, etag: `"${createHash('sha256').update(body).digest('base64url').slice(0, 22)}"` });
  }
  return assets;
}

/**
 * Only this server's own files, API and images, plus the origins image URLs point to. Origins, not
 * URLs: a source with a path (PUBLIC_BASE_URL's) would allow that one path and nothing under it.
 */
function contentSecurityPolicy(imageOrigins: readonly string[]): string {
  const self = ["'self'", ...imageOrigins].join(' ');
  return [
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    `img-src ${self} data: blob:`,
    // blob: the page reads back its own streamed pictures (to edit them, or take variations).
    `connect-src ${self} blob:`,
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
  ].join('; ');
}

export async function playground(app: FastifyInstance, { dir = PLAYGROUND_DIR, imageOrigins = [] }: PlaygroundOptions = {}): Promise<void> {
  const assets = await loadAssets(dir);
  if (!assets.has('index.html')) {
    app.log.warn(`the playground page is not built (no ${path.join(dir, 'index.html')}): run \`npm run build\`; / answers 503 until then`);
  }
  const csp = contentSecurityPolicy(imageOrigins);

  function send(name: string, request: FastifyRequest, reply: FastifyReply): FastifyReply {
    const asset = assets.get(name);
    if (!asset) {
      if (name === 'index.html') {
        throw new ApiError(503, 'The playground page is not built on this server: run `npm run build` (it bundles web/ into dist/playground/) and restart.', {
          code: 'playground_not_built',
        });
      }
      throw new ApiError(404, `The playground has no file '${name}'.`, { code: 'not_found' });
    }
    reply
      .header('cache-control', 'no-cache')
      .header('etag', asset.etag)
      .header('x-content-type-options', 'nosniff')
      .header('referrer-policy', 'no-referrer');
    if (asset.contentType.startsWith('text/html')) reply.header('content-security-policy', csp);
    if (request.headers['if-none-match'] === asset.etag) return reply.code(304).send();
    return reply.type(asset.contentType).send(asset.body);
  }

  const page = { config: { public: true } };
  app.get('/', page, (request, reply) => send('index.html', request, reply));
  app.get(PLAYGROUND_PATH, page, (request, reply) => send('index.html', request, reply));
  app.get(PLAYGROUND_PATH.slice(0, -1), page, (_request, reply) => reply.redirect(PLAYGROUND_PATH, 308));
  app.get<{ Params: { name: string } }>(`${PLAYGROUND_PATH}:name`, page, (request, reply) => send(request.params.name, request, reply));
}
