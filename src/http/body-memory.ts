import type { FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../api/errors.js';
import { formatBytes } from '../util/bytes.js';
import type { ByteBudget } from '../util/byte-budget.js';
import { declaredBodyBytes } from './connections.js';

/**
 * UPLOAD_MEMORY: the request bodies held in memory, all requests together, from their first byte until
 * their requests end (a request waiting for a worker keeps its body: a form's files, a JSON edit's data
 * URIs). Forms (uploads.ts) and JSON bodies (content.ts) take from it as their bytes arrive. Without it
 * for JSON, each connection could hold a body of BODY_LIMIT: 600 connections of one key, each sending all
 * but the last byte of a 1 MB body, held 580 MB more for REQUEST_TIMEOUT_SECONDS, and MAX_CONNECTIONS
 * (4096) would hold 4 GB.
 */

/** When to retry a body refused for UPLOAD_MEMORY: bodies go as their requests end. */
const FULL_RETRY_SECONDS = 5;

/** The 429 of a body that finds UPLOAD_MEMORY full. */
export function bodyMemoryFull(memory: ByteBudget): ApiError {
  return ApiError.rateLimited(
    `Rate limit reached: the server holds as much of requests' bodies (uploaded images, prompts) as it may (UPLOAD_MEMORY, ${formatBytes(memory.limit)}), most of them waiting for a worker. Please try again in ${FULL_RETRY_SECONDS}s.`,
    { 'retry-after': String(FULL_RETRY_SECONDS) },
  );
}

/**
 * The request's share of `memory`: the function returned takes bytes as they arrive, or answers false
 * (taking nothing) when they do not fit, for the caller to refuse the body with bodyMemoryFull. All it
 * took goes back once the answer is done or the client left. A body declared larger than what is free
 * is refused (thrown) now, before any of it is read.
 */
export function holdBodyMemory(request: FastifyRequest, reply: FastifyReply, memory: ByteBudget): (bytes: number) => boolean {
  if (declaredBodyBytes(request) > memory.limit - memory.inUse) throw bodyMemoryFull(memory);
  let held = 0;
  let done = false;
  reply.raw.once('close', () => {
    done = true;
    memory.release(held);
    held = 0;
  });
  return (bytes) => {
    // A body still arriving after its answer (read and dropped, connections.ts) is held by nobody.
    if (done) return true;
    if (!memory.take(bytes)) return false;
    held += bytes;
    return true;
  };
}
