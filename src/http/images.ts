import type { FastifyInstance, FastifyReply } from 'fastify';
import { parseGenerationRequest, type ImagesResponse } from '../api/wire.js';
import { streamImages } from './event-stream.js';
import { answer, generateContext, type ImagesOptions } from './image-context.js';

/** POST /v1/images/generations. */

export async function images(app: FastifyInstance, options: ImagesOptions): Promise<void> {
  app.post('/v1/images/generations', async (request, reply): Promise<ImagesResponse | FastifyReply> => {
    const body = parseGenerationRequest(request.body, options.defaultModel);
    const context = await generateContext(request, reply, body, options);
    if (body.stream) return streamImages(request, reply, 'image_generation', body, (onEvent) => options.service.generate(body, { ...context, onEvent }));
    return answer(reply, await options.service.generate(body, context));
  });
}
