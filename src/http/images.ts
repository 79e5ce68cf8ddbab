import type { FastifyInstance } from 'fastify';
import { parseGenerationRequest, type ImagesResponse } from '../api/wire.js';
import { generateContext, type ImagesOptions } from './image-context.js';

/** POST /v1/images/generations. */

export async function images(app: FastifyInstance, options: ImagesOptions): Promise<void> {
  app.post('/v1/images/generations', async (request, reply): Promise<ImagesResponse> => {
    const body = parseGenerationRequest(request.body, options.defaultModel);
    return options.service.generate(body, generateContext(request, reply, body, options));
  });
}
