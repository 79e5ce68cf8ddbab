import type { FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../api/errors.js';
import { formatBytes } from '../util/bytes.js';
import { ByteBudget, clientShare } from '../util/byte-budget.js';
import { declaredBodyBytes } from './connections.js';

/**
 * UPLOAD_MEMORY: the request bodies held in memory, all requests together, from their first byte until
 * their requests end (a request waiting for a worker keeps its body: a form's files, a JSON edit's data
 * URIs). Forms (uploads.ts) and JSON bodies (content.ts) take from it as their bytes arrive. Without it
 * for JSON, each connection could hold a body of BODY_LIMIT: 600 connections of one key, each sending all
 * but the last byte of a 1 MB body, held 580 MB more for REQUEST_TIMEOUT_SECONDS, and MAX_CONNECTIONS
 * (4096) would hold 4 GB.
 *
 * One API key holds at most half of it (or the largest body one request may send, where that is more):
 * the same unfinished bodies, or edits waiting for a worker with their uploads, filled all of it, and
 * every other key's requests got 429 for as long as that key kept it up, whatever its own limits (its
 * bodies, never finished, were never counted against them). A server without keys has one client.
 */

/** When to retry a body refused for UPLOAD_MEMORY: bodies go as their requests end. */
const FULL_RETRY_SECONDS = 5;

/** UPLOAD_MEMORY's budget, of which one key may hold half, or `largestBody` (the most one request may send) where that is more. */
export function uploadMemoryBudget(limit: number, largestBody: number): ByteBudget {
  return new ByteBudget(limit, clientShare(limit, largestBody));
}

/** The 429 of a body that does not fit: UPLOAD_MEMORY is full, or `holder` (a key's label) holds its share of it. */
function bodyMemoryFull(memory: ByteBudget, bytes: number, holder: string | undefined): ApiError {
  const retry = `Please try again in ${FULL_RETRY_SECONDS}s.`;
  const whole = `UPLOAD_MEMORY, ${formatBytes(memory.limit)}`;
  const message =
    holder !== undefined && memory.share < memory.limit && memory.heldBy(holder) + bytes > memory.share
      ? `Rate limit reached: this API key's requests hold as much of their bodies (uploaded images, prompts) in the server's memory as one key may (${formatBytes(memory.share)} of ${whole}, so that other keys' requests still get in), most of them waiting for a worker. ${retry}`
      : `Rate limit reached: the server holds as much of requests' bodies (uploaded images, prompts) as it may (${whole}), most of them waiting for a worker. ${retry}`;
  return ApiError.rateLimited(message, { 'retry-after': String(FULL_RETRY_SECONDS) });
}

/**
 * The request's share of `memory`: the function returned takes bytes as they arrive, answering the 429
 * to refuse the body with (taking nothing) when they do not fit. All it took goes back once the answer is
 * done or the client left. A body declared larger than the room left to it is refused (thrown) now,
 * before any of it is read.
 */
export function holdBodyMemory(request: FastifyRequest, reply: FastifyReply, memory: ByteBudget): (bytes: number) => ApiError | undefined {
  const holder = request.apiKey?.label;
  const declared = declaredBodyBytes(request);
  if (declared > memory.room(holder)) throw bodyMemoryFull(memory, declared, holder);
  let held = 0;
  let done = false;
  reply.raw.once('close', () => {
    done = true;
    memory.release(held, holder);
    held = 0;
  });
  return (bytes) => {
    // A body still arriving after its answer (read and dropped, connections.ts) is held by nobody.
    if (done) return undefined;
    if (!memory.take(bytes, holder)) return bodyMemoryFull(memory, bytes, holder);
    held += bytes;
    return undefined;
  };
}
