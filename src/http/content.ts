import { isUtf8 } from 'node:buffer';
import { Transform, type Readable } from 'node:stream';
import { createBrotliDecompress, createGunzip, createInflate } from 'node:zlib';
import type { FastifyInstance, FastifyRequest, RequestPayload } from 'fastify';
import fp from 'fastify-plugin';
import { ApiError } from '../api/errors.js';
import type { ByteBudget } from '../util/byte-budget.js';
import { holdBodyMemory } from './body-memory.js';
import { declaresJsonOverLimit } from './connections.js';
import { bodyTooLarge } from './errors.js';
import { sendsForm } from './raw-headers.js';

/**
 * What a request body may be: JSON only (Fastify would also take text/plain, which made a JSON body
 * sent as text/plain a confusing 400 instead of a 415), and compressed with gzip, deflate or br if the
 * client says so in Content-Encoding (a multipart form must come uncompressed). A compressed body counts against BODY_LIMIT as decompressed, and
 * decompression stops as soon as it passes the limit, so a small zip bomb costs only BODY_LIMIT of work.
 * A JSON body's bytes (decompressed) count against UPLOAD_MEMORY until its request ends (body-memory.ts).
 */

export interface ContentOptions {
  /** UPLOAD_MEMORY, shared with the forms of edits and variations. */
  memory: ByteBudget;
}

/** Charsets a body may declare: UTF-8, and ASCII, which is UTF-8 too. */
const TEXT_CHARSETS = new Set(['utf-8', 'utf8', 'us-ascii', 'ascii']);

const DECODERS: Record<string, () => Transform> = {
  gzip: createGunzip,
  'x-gzip': createGunzip,
  deflate: createInflate,
  br: createBrotliDecompress,
};

/** The decoded body, counting the encoded bytes where Fastify checks them against Content-Length. */
function decode(request: FastifyRequest, payload: RequestPayload, decoder: Transform, encoding: string): RequestPayload {
  const limit = request.routeOptions.bodyLimit;
  let decoded = 0;
  const body = Object.assign(
    new Transform({
      transform(chunk: Buffer, _encoding, done) {
        decoded += chunk.length;
        if (decoded <= limit) return done(null, chunk);
        done(bodyTooLarge(request, true));
      },
    }),
    { receivedEncodedLength: 0 },
  );
  payload.on('data', (chunk: Buffer) => (body.receivedEncodedLength += chunk.length));
  // pipe(), not pipeline(): an error must not destroy the request, whose socket still carries the answer.
  payload.pipe(decoder).pipe(body);
  payload.on('error', (err) => body.destroy(err));
  decoder.on('error', () =>
    body.destroy(new ApiError(400, `The request body could not be decompressed as ${encoding}, as its Content-Encoding says it is.`, { code: 'invalid_content_encoding' })),
  );
  // Fastify listens while it reads the body; a body nobody reads (a GET, an unknown URL) must still not
  // crash the process with an unhandled 'error'.
  body.on('error', () => {});
  body.on('close', () => {
    (payload as Readable).unpipe(decoder);
    decoder.destroy();
  });
  return body;
}

/**
 * The body as it is read, each chunk taken by `take` first: one that does not fit fails the body with
 * UPLOAD_MEMORY's 429 that `take` answers (an error of the stream Fastify reads, as decode's 413 is).
 */
function held(payload: RequestPayload, take: (bytes: number) => ApiError | undefined): RequestPayload {
  const body: Transform & { receivedEncodedLength?: number } = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      const refusal = take(chunk.length);
      if (refusal) return done(refusal);
      done(null, chunk);
    },
  });
  // Fastify checks Content-Length against the encoded bytes a decoding stream counts, else against what it read.
  Object.defineProperty(body, 'receivedEncodedLength', { get: () => payload.receivedEncodedLength });
  payload.pipe(body);
  payload.on('error', (err) => body.destroy(err));
  body.on('error', () => {});
  body.on('close', () => (payload as Readable).unpipe(body));
  return body;
}

async function contentPlugin(app: FastifyInstance, { memory }: ContentOptions): Promise<void> {
  app.removeContentTypeParser('text/plain');

  // JSON read as bytes, then parsed by Fastify's own parser: read as a string, bytes that are no UTF-8
  // would become U+FFFD in the prompt, drawn without a word to the client.
  const parseJson = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body: Buffer, done) => {
    if (!isUtf8(body)) return done(new ApiError(400, 'The request body is not valid UTF-8: JSON must be sent in UTF-8 (RFC 8259). Encode the text as UTF-8 before sending it.', { code: 'invalid_encoding' }));
    parseJson(request, body.toString('utf8'), done);
  });

  app.addHook('preParsing', async (request, reply, payload) => {
    // JSON is UTF-8 (RFC 8259); Fastify would read a body of any declared charset as UTF-8.
    const charset = /;\s*charset\s*=\s*"?([^";\s]+)/i.exec(request.headers['content-type'] ?? '')?.[1].toLowerCase();
    if (charset && !TEXT_CHARSETS.has(charset)) {
      throw new ApiError(415, `Unsupported charset '${charset}': send the body in UTF-8.`, { code: 'unsupported_media_type' });
    }
    const encoding = request.headers['content-encoding']?.trim().toLowerCase();
    // @fastify/multipart reads the request itself, not this hook's streams (uploads.ts counts a form).
    const form = sendsForm(request);
    const hasBody = request.headers['content-length'] !== undefined || request.headers['transfer-encoding'] !== undefined;
    // A body declared over BODY_LIMIT gets Fastify's 413 before any of it is read: held, it would get
    // UPLOAD_MEMORY's 429 while the memory is busy, which the SDKs retry though it can never pass.
    const take = hasBody && !form && !declaresJsonOverLimit(request) ? holdBodyMemory(request, reply, memory) : undefined;
    const counted = (body: RequestPayload) => (take ? held(body, take) : body);
    if (!encoding || encoding === 'identity') return counted(payload);
    if (form) {
      throw new ApiError(415, `Unsupported Content-Encoding '${encoding}' for a multipart/form-data body: send it uncompressed (its pictures are compressed already).`, {
        code: 'unsupported_content_encoding',
      });
    }
    const decoder = DECODERS[encoding];
    if (!decoder) {
      throw new ApiError(415, `Unsupported Content-Encoding '${encoding}': send the body uncompressed or compressed with one of gzip, deflate, br.`, {
        code: 'unsupported_content_encoding',
      });
    }
    return counted(decode(request, payload, decoder(), encoding));
  });
}

export const content = fp(contentPlugin, { name: 'content' });
