import type { FastifyReply, FastifyRequest } from 'fastify';
import type { ApiError } from '../api/errors.js';
import type { ByteBudget } from '../util/byte-budget.js';
import { declaredBodyBytes } from './connections.js';
import { clientOf } from './auth.js';
import { memoryFull, MEMORY_RETRY_SECONDS, shareOf, type MemoryWords } from './memory-share.js';

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

/** The words of UPLOAD_MEMORY's 429. */
const BODY_WORDS: MemoryWords = {
  setting: 'UPLOAD_MEMORY',
  keyHolds: (amount) =>
    `this API key's requests hold as much of their bodies (uploaded images, prompts) in the server's memory as one key may (${amount}, so that other keys' requests still get in), most of them waiting for a worker.`,
  serverHolds: (amount) => `the server holds as much of requests' bodies (uploaded images, prompts) as it may (${amount}), most of them waiting for a worker.`,
  advice: `Please try again in ${MEMORY_RETRY_SECONDS}s.`,
};

/**
 * The request's share of `memory`: the function returned takes bytes as they arrive, answering the 429
 * to refuse the body with (taking nothing) when they do not fit. All it took goes back once the answer is
 * done or the client left (memory-share.ts). A body declared larger than the room left to it is refused
 * (thrown) now, before any of it is read.
 */
export function holdBodyMemory(request: FastifyRequest, reply: FastifyReply, memory: ByteBudget): (bytes: number) => ApiError | undefined {
  const holder = clientOf(request);
  const declared = declaredBodyBytes(request);
  if (declared > memory.room(holder)) throw memoryFull(memory, declared, holder, BODY_WORDS);
  // A body still arriving after its answer (read and dropped, connections.ts) is held by nobody: the
  // share, closed, takes it without counting.
  const share = shareOf(request, reply, memory);
  return (bytes) => (share.take(bytes) ? undefined : memoryFull(memory, bytes, holder, BODY_WORDS));
}
