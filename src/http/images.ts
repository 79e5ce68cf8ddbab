import type { FastifyInstance } from 'fastify';
import type { ImageService } from '../service/images.js';
import { ApiError } from './errors.js';
import { imagePath } from './files.js';
import { parseGenerationRequest, type ImagesResponse } from './wire.js';

/** POST /v1/images/generations. */

export interface ImagesOptions {
  service: ImageService;
  /** Fixed origin for image URLs; otherwise each request's own (proxy headers count when trusted). */
  publicBaseUrl?: string;
}

export async function images(app: FastifyInstance, { service, publicBaseUrl }: ImagesOptions): Promise<void> {
  app.post('/v1/images/generations', async (request, reply): Promise<ImagesResponse> => {
    const body = parseGenerationRequest(request.body);
    const disconnected = new AbortController();
    reply.raw.on('close', () => {
      if (!reply.raw.writableFinished) disconnected.abort(new ApiError(499, 'The client closed the connection.'));
    });
    const base = publicBaseUrl ?? `${request.protocol}://${request.host}`;
    return service.generate(body, {
      signal: disconnected.signal,
      urlFor: (image) => `${base}${imagePath(image)}`,
      log: request.log,
    });
  });
}
