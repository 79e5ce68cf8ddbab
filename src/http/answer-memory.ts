import { Transform, type TransformCallback } from 'node:stream';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { ByteBudget } from '../util/byte-budget.js';
import { clientOf } from './auth.js';
import { memoryFull, MEMORY_RETRY_SECONDS, shareOf, type MemoryShare, type MemoryWords, type RoomWait } from './memory-share.js';

/**
 * ANSWER_MEMORY: the answers held in memory for clients that have not read them yet, all requests
 * together: a b64_json answer's images from when it is ready to be written until the socket has taken
 * all of it (the kernel holds the last few megabytes, bounded per socket) or the connection ends; a
 * streamed answer's events from when each is written until the response takes it. SEND_TIMEOUT_SECONDS
 * and SEND_MIN_RATE bound each answer in time only: a client taking 16 KiB a second keeps a 10 MB answer
 * (the embedded model's n=10 at 1792x1024, made in 1.4 s) for ten minutes, and 20 such clients held
 * 190 MB of the server for as long; MAX_CONNECTIONS (4096) of them would hold 40 GB, and real models'
 * answers are larger. Requests are refused while it is full, before any work is queued for them (no
 * generation is spent on an answer nobody reads).
 *
 * A request cannot tell the size of its answer before it is made, so before its work is queued it sets
 * aside the most its answer may take (service/answer-size.ts), which counts until the answer is made,
 * and then what it holds does. Only let in while a byte more fitted, the requests admitted together
 * (as many as the queue's limits let in) each counted their answer whole once it was made: three of the
 * embedded model's n=10 answers held 29 MB of a 24 MiB ANSWER_MEMORY. One whose most does not fit waits
 * (in the queue, keeping a place there) for the room others give back as their answers are made or
 * read, for at most QUEUE_TIMEOUT_SECONDS, then gets the 429. It holds nothing while it waits, so it
 * waits on other requests only; those waiting take room in the order they came (ByteBudget.takeInTurn).
 * What one request sets aside is at most a key's share, so that a lone request always fits: an answer
 * larger than that (ANSWER_MEMORY under twice the largest answer) still goes, alone, and passes the
 * share by its excess.
 *
 * Once an API key holds half of it in unread answers, its requests get the 429, so that a key's slow
 * readers cannot keep every other key's requests out. A server without keys has one client.
 * Only answers that hold memory count and are refused: a `url` answer names its images, which the files
 * route reads from the store 64 KiB at a time as the socket drains (100 clients leaving 32 MiB images
 * unread grew the server by 43 MB, not 3.2 GB).
 */

/** The words of ANSWER_MEMORY's 429. */
const ANSWER_WORDS: MemoryWords = {
  setting: 'ANSWER_MEMORY',
  keyHolds: (amount) =>
    `this API key's earlier answers (b64_json images, streamed events) hold as much of the server's memory as one key may (${amount}, so that other keys' requests still get in): their clients have not read them yet, or they are still being made (counted at the most they may take).`,
  serverHolds: (amount) =>
    `earlier answers (b64_json images, streamed events) hold all the server's memory they may (${amount}): their clients have not read them yet, or they are still being made (counted at the most they may take).`,
  advice: `Read those answers (or close their connections) and try again in ${MEMORY_RETRY_SECONDS}s; ask for response_format url, whose images wait in the store instead; or have the server's ANSWER_MEMORY raised if this many answers at once, or clients this slow, are expected.`,
};

/**
 * The share of `memory` of a request whose answer will hold memory; refuses it (throws the 429) while
 * its key's (or, without keys, the server's) unread answers already hold all it may. Room set aside for
 * answers being made refuses nothing yet: it comes back as they are made, and the request waits for it.
 */
export function answerShare(request: FastifyRequest, reply: FastifyReply, memory: ByteBudget): MemoryShare {
  const holder = clientOf(request);
  if (memory.roomBesidesAside(holder) < 1) throw memoryFull(memory, 1, holder, ANSWER_WORDS);
  return shareOf(request, reply, memory);
}

/**
 * Sets aside `bytes`, the most the answer may take (at most a key's share: a lone request always fits),
 * waiting for room as RoomWait says; the 429 when none came in time.
 */
export async function reserveAnswer(request: FastifyRequest, memory: ByteBudget, share: MemoryShare, bytes: number, wait: RoomWait): Promise<void> {
  const most = Math.min(bytes, memory.share);
  const came = performance.now();
  if (await share.reserve(most, wait)) return;
  throw memoryFull(memory, most, clientOf(request), ANSWER_WORDS, Math.round((performance.now() - came) / 1000));
}

/** Holds `bytes` of a b64_json answer, ready to be written, until its response has been handed to the socket whole or closed; its reservation ends. */
export function holdAnswer(share: MemoryShare, bytes: number): void {
  share.hold(bytes);
  share.settle();
}

/**
 * The stream of a streamed answer's events, which the response takes as the client reads: each piece
 * added counts from then until the response takes it from here (the response then holds it, with the
 * socket, within their buffers' bounds: Fastify's pipe waits for them to drain).
 */
export class AnswerEvents extends Transform {
  constructor(private readonly share: MemoryShare) {
    super();
  }

  /** Adds `piece` to the answer. */
  add(piece: string): void {
    // Encoded once: counted by its bytes, and written as them (a string written would be encoded again).
    const bytes = Buffer.from(piece);
    this.share.hold(bytes.byteLength);
    this.write(bytes);
  }

  /** Ends the answer: nothing more is added, and its reservation ends (what is left unread still counts). */
  finish(): void {
    this.share.settle();
    this.end();
  }

  override _transform(piece: Buffer, _encoding: BufferEncoding, passOn: TransformCallback): void {
    this.share.release(piece.byteLength);
    passOn(null, piece);
  }
}
