import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { ApiError } from '../api/errors.js';
import { declaresJsonOverLimit } from './connections.js';

/**
 * `Expect: 100-continue`: a client asks whether to send its body. Node would say yes at once, before
 * the key is checked; here the request goes through onRequest (auth, Host) first and "100 Continue" is
 * sent only when the body is about to be read, so a refused client never sends its body (nor one whose
 * declared JSON body is over BODY_LIMIT). Any other expectation gets 417 in OpenAI's shape instead of
 * Node's bare one.
 */

async function expectPlugin(app: FastifyInstance): Promise<void> {
  // With a listener, Node hands such requests over without answering them.
  const handOver = (...args: unknown[]) => app.server.emit('request', ...args);
  app.server.on('checkContinue', handOver);
  app.server.on('checkExpectation', handOver);

  app.addHook('onRequest', async (request) => {
    const expectation = request.headers.expect?.toLowerCase();
    if (expectation !== undefined && expectation !== '100-continue') {
      throw new ApiError(417, `Unsupported expectation '${request.headers.expect}': only 'Expect: 100-continue' is supported.`, {
        code: 'expectation_failed',
      });
    }
  });

  app.addHook('preParsing', async (request, reply, payload) => {
    // A JSON body declared over BODY_LIMIT gets its 413 as its reading starts: its client need not send it.
    if (request.headers.expect?.toLowerCase() === '100-continue' && !reply.raw.headersSent && !declaresJsonOverLimit(request)) reply.raw.writeContinue();
    return payload;
  });
}

export const expectContinue = fp(expectPlugin, { name: 'expect' });
