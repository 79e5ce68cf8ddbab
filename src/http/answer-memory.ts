import { Transform, type TransformCallback } from 'node:stream';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { ByteBudget } from '../util/byte-budget.js';
import { clientOf } from './auth.js';
import { memoryFull, MEMORY_RETRY_SECONDS, shareOf, type MemoryShare, type MemoryWords } from './memory-share.js';

/**
 * ANSWER_MEMORY: the answers held in memory for clients that have not read them yet, all requests
 * together: a b64_json answer's images from when it is ready to be written until the socket has taken
 * all of it (the kernel holds the last few megabytes, bounded per socket) or the connection ends; a
 * streamed answer's events from when each is written until the response takes it. SEND_TIMEOUT_SECONDS
 * and SEND_MIN_RATE bound each answer in time only: a client taking 16 KiB a second keeps a 10 MB answer
 * (the embedded model's n=10 at 1792x1024, made in 1.4 s) for ten minutes, and 20 such clients held
 * 190 MB of the server for as long; MAX_CONNECTIONS (4096) of them would hold 40 GB, and real models'
 * answers are larger. Requests are refused while it is full, before any work is queued for them (no
 * generation is spent on an answer nobody reads); an answer made while it is full is still sent whole:
 * the work promised is never dropped, and what it holds only keeps later requests out a while longer.
 *
 * Once an API key holds half of it in unread answers, its requests get the 429, so that a key's slow
 * readers cannot keep every other key's requests out. A server without keys has one client. A request
 * cannot tell the size of its answer before it is made, so a key may pass its half by the answers of
 * the requests it had waiting or running by then (as many as the queue's limits let in), never more.
 * Only answers that hold memory count and are refused: a `url` answer names its images, which the files
 * route reads from the store 64 KiB at a time as the socket drains (100 clients leaving 32 MiB images
 * unread grew the server by 43 MB, not 3.2 GB).
 */

/** The words of ANSWER_MEMORY's 429. */
const ANSWER_WORDS: MemoryWords = {
  setting: 'ANSWER_MEMORY',
  keyHolds: (amount) =>
    `this API key's earlier answers (b64_json images, streamed events) hold as much of the server's memory as one key may (${amount}, so that other keys' requests still get in): their clients have not read them yet.`,
  serverHolds: (amount) => `earlier answers (b64_json images, streamed events) hold all the server's memory they may (${amount}): their clients have not read them yet.`,
  advice: `Read those answers (or close their connections) and try again in ${MEMORY_RETRY_SECONDS}s; ask for response_format url, whose images wait in the store instead; or have the server's ANSWER_MEMORY raised if clients this slow are expected.`,
};

/**
 * Refuses (throws the 429) a request whose answer would hold memory while its key (or, without keys,
 * the server) already holds all it may in unread answers. Its answer's size is unknown until it is made:
 * a request is let in while a byte more would fit, and its answer then counts whole.
 */
export function checkAnswerMemory(request: FastifyRequest, memory: ByteBudget): void {
  const holder = clientOf(request);
  if (memory.room(holder) < 1) throw memoryFull(memory, 1, holder, ANSWER_WORDS);
}

/** Holds `bytes` of a b64_json answer, ready to be written, until its response has been handed to the socket whole or closed. */
export function holdAnswer(request: FastifyRequest, reply: FastifyReply, memory: ByteBudget, bytes: number): void {
  shareOf(request, reply, memory).hold(bytes);
}

/**
 * The stream of a streamed answer's events, which the response takes as the client reads: each piece
 * added counts from then until the response takes it from here (the response then holds it, with the
 * socket, within their buffers' bounds: Fastify's pipe waits for them to drain).
 */
export class AnswerEvents extends Transform {
  private readonly share: MemoryShare;

  constructor(request: FastifyRequest, reply: FastifyReply, memory: ByteBudget) {
    super();
    this.share = shareOf(request, reply, memory);
  }

  /** Adds `piece` to the answer. */
  add(piece: string): void {
    // Encoded once: counted by its bytes, and written as them (a string written would be encoded again).
    const bytes = Buffer.from(piece);
    this.share.hold(bytes.byteLength);
    this.write(bytes);
  }

  override _transform(piece: Buffer, _encoding: BufferEncoding, passOn: TransformCallback): void {
    this.share.release(piece.byteLength);
    passOn(null, piece);
  }
}
