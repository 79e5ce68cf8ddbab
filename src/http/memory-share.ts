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
 * leave clients refused for good. A share may also set aside what its request is yet to hold (an
 * answer not made yet), waiting for room to do so. Also the 429 of a request that finds no room.
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
 * they pass, else as the whole budget; and how long the request waited for room, where it did.
 */
export function memoryFull(memory: ByteBudget, bytes: number, holder: string | undefined, words: MemoryWords, waitedSeconds?: number): ApiError {
  const whole = `${words.setting}, ${formatBytes(memory.limit)}`;
  const overShare = holder !== undefined && memory.share < memory.limit && memory.heldBy(holder) + bytes > memory.share;
  const reason = overShare ? words.keyHolds(`${formatBytes(memory.share)} of ${whole}`) : words.serverHolds(whole);
  const waited = waitedSeconds === undefined ? '' : ` (waited ${waitedSeconds}s for room)`;
  return ApiError.rateLimited(words.setting, `Rate limit reached${waited}: ${reason} ${words.advice}`, { 'retry-after': String(MEMORY_RETRY_SECONDS) });
}

/** What one request holds of a budget until its response closes. */
export interface MemoryShare {
  /** Takes `bytes` if they fit (false, taking nothing, if not); once the response closed, counts nothing and refuses nothing. */
  take(bytes: number): boolean;
  /** Counts `bytes` whether they fit or not (they are in memory already); once the response closed, nothing. */
  hold(bytes: number): void;
  /** Gives back `bytes` of what it took or held, before the response closes. */
  release(bytes: number): void;
  /**
   * Sets `bytes` aside for what the request is yet to hold (an answer not made yet): until settle(), the
   * share counts at least that much, what it holds meanwhile included. While they do not fit, waits for
   * what others give back (see RoomWait): true once set aside, false if they did not fit in time.
   */
  reserve(bytes: number, wait: RoomWait): Promise<boolean>;
  /** Ends the reservation: from now on the share counts what it holds. */
  settle(): void;
}

/** How long a reservation may wait for room, and what it tells as it begins to. */
export interface RoomWait {
  /** Aborts the wait (the client gone): reserve() rejects with its reason. */
  signal: AbortSignal;
  /** The longest wait, after which reserve() gives up (false). */
  maxWaitMs: number;
  /**
   * Called once, as the wait begins; what it throws ends the wait, and is reserve()'s. Returns the ms
   * the request waited already (in other waits before this one), which `maxWaitMs` bounds as well.
   */
  onWait(): number;
}

/** The request's share of `memory`, all of it given back as its response closes (at once, where it closed already). */
export function shareOf(request: FastifyRequest, reply: FastifyReply, memory: ByteBudget): MemoryShare {
  const holder = clientOf(request);
  const response = reply.raw;
  let held = 0;
  let reserved = 0;
  // What the reservation counts beyond what is held: the budget keeps it apart (ByteBudget.setAside).
  const aside = () => Math.max(0, reserved - held);
  // A response closed already (its client gone while the request waited or its answer was made): a
  // 'close' listened for now would never come, and what it held would stay counted for good.
  let open = !response.destroyed;
  /** Counts `nextHeld` held and `nextReserved` reserved; where `fit` and that counts more than fits, nothing (false). */
  const count = (nextHeld: number, nextReserved: number, fit: boolean): boolean => {
    if (!open) return true;
    const [heldBefore, asideBefore] = [held, aside()];
    const nextAside = Math.max(0, nextReserved - nextHeld);
    const more = nextHeld - heldBefore + nextAside - asideBefore;
    if (fit && more > 0 && more > memory.room(holder)) return false;
    [held, reserved] = [nextHeld, nextReserved];
    if (nextHeld >= heldBefore) memory.hold(nextHeld - heldBefore, holder);
    else memory.release(heldBefore - nextHeld, holder);
    memory.setAside(nextAside - asideBefore, holder);
    return true;
  };
  // Whichever way the response closes, all the share held and set aside goes back, through count as all else.
  if (open) {
    response.once('close', () => {
      count(0, 0, false);
      open = false;
    });
  }
  return {
    take: (bytes) => count(held + bytes, reserved, true),
    hold: (bytes) => void count(held + bytes, reserved, false),
    release: (bytes) => void count(held - bytes, reserved, false),
    settle: () => void count(held, 0, false),
    async reserve(bytes, { signal, maxWaitMs, onWait }) {
      const fits = () => count(held, Math.max(reserved, bytes), true);
      // Its own timer, not AbortSignal.timeout(): joined to another by AbortSignal.any, nothing holds
      // that one, and Node 20's garbage collector took it, so that the wait never timed out.
      const deadline = new AbortController();
      let timer: NodeJS.Timeout | undefined;
      const waits = () => {
        const waitedBefore = onWait();
        timer = setTimeout(() => deadline.abort(), Math.max(0, maxWaitMs - waitedBefore));
        return AbortSignal.any([signal, deadline.signal]);
      };
      try {
        await memory.takeInTurn(holder, bytes, fits, waits);
        return true;
      } catch (err) {
        if (signal.aborted) throw signal.reason;
        if (deadline.signal.aborted) return false;
        throw err;
      } finally {
        clearTimeout(timer);
      }
    },
  };
}
