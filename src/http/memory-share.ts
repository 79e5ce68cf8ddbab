import type { FastifyReply, FastifyRequest } from 'fastify';
import { ApiError, type RateLimit } from '../api/errors.js';
import { formatBytes } from '../util/bytes.js';
import type { ByteBudget } from '../util/byte-budget.js';
import { clientOf } from './auth.js';

/**
 * A request's share of a memory budget that all requests share, held by its API key (its label; a
 * server without keys has one client): UPLOAD_MEMORY for its body (body-memory.ts), ANSWER_MEMORY for
 * its answer (answer-memory.ts). What a request holds goes back as its response closes, whichever way
 * it ends (answered; the client gone or reset; cut by SEND_TIMEOUT_SECONDS; a pipelined request's
 * connection gone, connections.ts): one place gives back, so that no path leaks room, which would
 * leave clients refused for good. Also the 429 of a request that finds no room.
 */

/** When to retry a request refused for memory: bodies go as their requests end, answers as their clients read them. */
export const MEMORY_RETRY_SECONDS = 5;

/** The words of a budget's 429: what holds it, said of one key's requests or of the whole server. */
export interface MemoryWords {
  /** The setting, e.g. UPLOAD_MEMORY. */
  setting: Extract<RateLimit, `${string}_MEMORY`>;
  /** Why a key is refused its share: `amount` reads "X of SETTING, Y". */
  keyHolds(amount: string): string;
  /** Why the server is full: `amount` reads "SETTING, Y". */
  serverHolds(amount: string): string;
  /** What to do: when to retry, and what else helps. */
  advice: string;
}

/**
 * The 429 of `bytes` that do not fit `memory` for `holder`: said as its key's share where that is what
 * they pass, else as the whole budget.
 */
export function memoryFull(memory: ByteBudget, bytes: number, holder: string | undefined, words: MemoryWords): ApiError {
  const whole = `${words.setting}, ${formatBytes(memory.limit)}`;
  const overShare = holder !== undefined && memory.share < memory.limit && memory.heldBy(holder) + bytes > memory.share;
  const reason = overShare ? words.keyHolds(`${formatBytes(memory.share)} of ${whole}`) : words.serverHolds(whole);
  return ApiError.rateLimited(words.setting, `Rate limit reached: ${reason} ${words.advice}`, { 'retry-after': String(MEMORY_RETRY_SECONDS) });
}

/** What one request holds of a budget until its response closes. */
export interface MemoryShare {
  /** Takes `bytes` if they fit (false, taking nothing, if not); once the response closed, counts nothing and refuses nothing. */
  take(bytes: number): boolean;
  /** Counts `bytes` whether they fit or not (they are in memory already); once the response closed, nothing. */
  hold(bytes: number): void;
  /** Gives back `bytes` of what it took or held, before the response closes. */
  release(bytes: number): void;
}

/** The request's share of `memory`, all of it given back as its response closes (at once, where it closed already). */
export function shareOf(request: FastifyRequest, reply: FastifyReply, memory: ByteBudget): MemoryShare {
  const holder = clientOf(request);
  const response = reply.raw;
  let held = 0;
  // A response closed already (its client gone while the request waited or its answer was made): a
  // 'close' listened for now would never come, and what it held would stay counted for good.
  let open = !response.destroyed;
  if (open) {
    response.once('close', () => {
      open = false;
      memory.release(held, holder);
      held = 0;
    });
  }
  return {
    take(bytes) {
      if (!open) return true;
      if (!memory.take(bytes, holder)) return false;
      held += bytes;
      return true;
    },
    hold(bytes) {
      if (!open) return;
      memory.hold(bytes, holder);
      held += bytes;
    },
    release(bytes) {
      if (!open) return;
      memory.release(bytes, holder);
      held -= bytes;
    },
  };
}
