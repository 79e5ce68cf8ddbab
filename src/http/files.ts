import type { FastifyInstance } from 'fastify';
import { IMAGE_EXTENSIONS } from '../runtime/types.js';
import { IMAGE_ID, type ImageStore, type StoredImage } from '../store/image-store.js';
import { ApiError } from '../api/errors.js';

/**
 * Serves stored images without an API key, so a plain <img src> works, for as long as they live.
 * The file name is checked against a strict pattern before it reaches the store: nothing else names
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

export async function files(app: FastifyInstance, { store }: FilesOptions): Promise<void> {
  app.get<{ Params: { name: string } }>(`${PREFIX}:name`, { config: { public: true } }, async (request, reply) => {
    const { name } = request.params;
    const match = FILE_NAME.exec(name);
    const image = match && store.get(match[1]);
    if (!image || image.ext !== match[2]) throw notFound(name);
    const data = await store.read(image);
    if (!data) throw notFound(name);
    const maxAge = Math.max(0, Math.floor((image.expiresAt - store.now()) / 1000));
    return reply
      .type(image.contentType)
      .header('cache-control', `public, max-age=${maxAge}, immutable`)
      .header('x-content-type-options', 'nosniff')
      .send(data);
  });
}
