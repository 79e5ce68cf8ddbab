import type { FastifyInstance, FastifyReply } from 'fastify';
import { parseImageRequest, type ImagesResponse } from '../api/wire.js';
import { respond, type ImagesOptions } from './image-routes.js';

/** POST /v1/images/generations. */

export async function images(app: FastifyInstance, options: ImagesOptions): Promise<void> {
  app.post('/v1/images/generations', async (request, reply): Promise<ImagesResponse | FastifyReply> => {
    const body = parseImageRequest('generation', request.body, { defaultModel: options.defaultModel });
    return respond(request, reply, 'image_generation', body, options);
  });
}
