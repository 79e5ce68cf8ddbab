import type { Readable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { IMAGE_EXTENSIONS } from '../runtime/types.js';
import { IMAGE_ID, StoreUnavailableError, type ImageStore, type StoredImage } from '../store/image-store.js';
import { ApiError } from '../api/errors.js';
import { storeUnavailable } from '../service/failures.js';

/**
 * Serves stored images without an API key, so a plain <img src> works, for as long as they live,
 * streamed from the store (with STORE=s3 any replica serves any replica's images). The file name is checked against a strict pattern before it reaches the store: nothing else names
 * a file, so no path can escape the store's folder.
 */

export interface FilesOptions {
  store: ImageStore;
}

const PREFIX = '/v1/images/files/';
const FILE_NAME = new RegExp(`^(${IMAGE_ID})\\.(${IMAGE_EXTENSIONS.join('|')})$`);

/** The path of a stored image's URL. */
export function imagePath(image: StoredImage): string {
  return `${PREFIX}${image.id}.${image.ext}`;
}

function notFound(name: string): ApiError {
  return new ApiError(404, `The image '${name}' does not exist or has expired (images live for a limited time after generation).`, {
    code: 'image_not_found',
  });
}

/**
 * The unexpired image `id` and, unless `headersOnly` (a HEAD: with STORE=s3 a read would download the
 * whole object to discard it), a stream of its bytes; null when there is none with extension `ext`.
 */
async function openImage(store: ImageStore, id: string, ext: string, headersOnly: boolean): Promise<{ image: StoredImage; data?: Readable } | null> {
  const image = await store.get(id);
  if (!image || image.ext !== ext) return null;
  if (headersOnly) return (await store.has(image)) ? { image } : null;
  const data = await store.read(image);
  return data && { image, data };
}

/**
 * Whether If-None-Match names `etag` (or is `*`). An image never changes under its id, so its id is a
 * strong ETag and a weak comparison (W/ ignored) is all RFC 9110 asks for GET; a few lines, no library.
 */
function matchesEtag(header: string | undefined, etag: string): boolean {
  if (!header) return false;
  return header.split(',').some((tag) => {
    const candidate = tag.trim().replace(/^W\//, '');
    return candidate === '*' || candidate === etag;
  });
}

export async function files(app: FastifyInstance, { store }: FilesOptions): Promise<void> {
  // HEAD is routed here too, not left to Fastify's own HEAD route, which would run the GET (reading the
  // image) and then answer Content-Length: 0 for the body this handler leaves out.
  app.route<{ Params: { name: string } }>({
    method: ['GET', 'HEAD'],
    url: `${PREFIX}:name`,
    config: { public: true },
    handler: async (request, reply) => {
      const { name } = request.params;
      const match = FILE_NAME.exec(name);
      if (!match) throw notFound(name);
      // A store that cannot be reached is a retryable 503 in OpenAI's shape, not a 404 that says the image is gone.
      const found = await openImage(store, match[1], match[2], request.method === 'HEAD').catch((err: unknown) => {
        throw err instanceof StoreUnavailableError ? storeUnavailable(err, 'Please retry shortly.') : err;
      });
      if (!found) throw notFound(name);
      const { image, data } = found;
      const maxAge = Math.max(0, Math.floor((image.expiresAt - store.now()) / 1000));
      const etag = `"${image.id}"`;
      reply.header('etag', etag).header('cache-control', `public, max-age=${maxAge}, immutable`).header('x-content-type-options', 'nosniff');
      // A client (a cache, a browser's reload) that has the image already gets no second copy.
      if (matchesEtag(request.headers['if-none-match'], etag)) {
        data?.destroy();
        return reply.code(304).send();
      }
      return reply.type(image.contentType).header('content-length', image.size).send(data);
    },
  });
}
