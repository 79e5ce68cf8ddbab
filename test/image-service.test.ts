import { describe, expect, it } from 'vitest';
import { ApiError } from '../src/api/errors.js';
import { parseImageRequest } from '../src/api/wire.js';
import { createImageService } from '../src/service/images.js';
import { startTestServer } from './helpers/api-server.js';
import { failureOf } from './helpers/failures.js';

/** The image service over a real engine and store (the stub model), called as the routes call it. */

describe('a streamed request ended as its last batch finishes', () => {
  // The shutdown's deadline can come between a batch's end and its images' hand-on (one turn of the
  // event loop each): the images not yet handed on were dropped and the stream ended as if whole.
  it('ends with what ended it, not as a whole answer with images missing', async () => {
    const server = await startTestServer();
    try {
      const service = createImageService({ registry: server.registry, engine: server.engine, store: server.store, defaultModel: 'stub' });
      const lifetime = new AbortController();
      const context = { signal: lifetime.signal, urlFor: () => '', log: { info: () => undefined } };
      const images: number[] = [];
      const request = parseImageRequest('generation', { model: 'stub', prompt: 'a red circle', n: 2, steps: 1, stream: true, response_format: 'b64_json' });
      const ended = await failureOf<ApiError>(
        service.stream(request, context, (event) => {
          if (event.type !== 'image') return;
          images.push(event.image);
          // The first image out, the second waits for its turn: as the shutdown's deadline would end it.
          lifetime.abort(ApiError.shuttingDown());
        }),
      );
      expect(images).toEqual([0]);
      expect(ended).toMatchObject({ status: 503, code: 'server_shutting_down' });
    } finally {
      await server.close();
    }
  });
});
