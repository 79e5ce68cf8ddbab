import type { FastifyInstance } from 'fastify';
import type { ImageService } from '../service/images.js';
import { imagePath } from './files.js';
import { parseGenerationRequest, type ImagesResponse } from '../api/wire.js';

/** POST /v1/images/generations. */

export interface ImagesOptions {
  service: ImageService;
  /** Fixed origin for image URLs; otherwise each request's own (proxy headers count when trusted). */
  publicBaseUrl?: string;
  /** Put the prompts in the logs; they are the users' private text, so off unless asked for. */
  logPrompts: boolean;
}

export async function images(app: FastifyInstance, { service, publicBaseUrl, logPrompts }: ImagesOptions): Promise<void> {
  app.post('/v1/images/generations', async (request, reply): Promise<ImagesResponse> => {
    const body = parseGenerationRequest(request.body);
    // Every later line of this request (errors, Fastify's "request completed") names what it asked for.
    request.log = reply.log = request.log.child({
      model: body.model,
      size: body.size ?? 'auto',
      n: body.n,
      ...(logPrompts && { prompt: body.prompt, negativePrompt: body.negative_prompt }),
    });
    const base = publicBaseUrl ?? `${request.protocol}://${request.host}`;
    return service.generate(body, {
      signal: request.cancellation,
      urlFor: (image) => `${base}${imagePath(image)}`,
      log: request.log,
    });
  });
}
