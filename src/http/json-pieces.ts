import { Readable } from 'node:stream';
import type { ImagesResponse } from '../api/wire.js';

/**
 * An images answer written as a stream of JSON pieces rather than one JSON.stringify: n=10 b64_json
 * images at photo sizes make a body of tens of megabytes, and stringifying it at once blocks the event
 * loop (every other client, health checks included) for as long as that takes. Here the base64 text
 * goes out in slices, one per read of the stream, so the loop turns between them. Base64 needs no JSON
 * escaping, which is what makes splicing it in safe.
 */

/**
 * Answers are written in pieces of at most this many bytes (here and in event-stream.ts; image files
 * are read 64 KiB at a time, Node's default): a socket counts a write as taken only once all of it is,
 * so SEND_MIN_RATE (connections.ts) sees progress in such steps.
 */
const WRITE_PIECE_BYTES = 64 * 1024;

/**
 * `text` in pieces of WRITE_PIECE_BYTES characters: as many bytes for base64 and JSON, which are ASCII
 * but for what a request gave (a streamed event echoes its `user`, any text). Each piece is encoded on
 * its own, so none ends between the two halves of a surrogate pair (an emoji): each went out as U+FFFD.
 */
export function* inPieces(text: string): Generator<string> {
  for (let at = 0; at < text.length; ) {
    let end = Math.min(at + WRITE_PIECE_BYTES, text.length);
    if (end < text.length && isHighSurrogate(text.charCodeAt(end - 1))) end--;
    yield text.slice(at, end);
    at = end;
  }
}

/** The first half of a surrogate pair (U+D800 to U+DBFF). */
const isHighSurrogate = (code: number) => (code & 0xfc00) === 0xd800;

export function imagesJson(response: ImagesResponse): Readable {
  return Readable.from(pieces(response), { objectMode: false });
}

function* pieces({ data, ...fields }: ImagesResponse): Generator<string> {
  const head = JSON.stringify(fields);
  yield head === '{}' ? '{"data":[' : `${head.slice(0, -1)},"data":[`;
  for (const [i, { b64_json, ...rest }] of data.entries()) {
    const others = JSON.stringify(rest).slice(1);
    if (b64_json === undefined) {
      yield `${i ? ',' : ''}{${others}`;
      continue;
    }
    yield `${i ? ',' : ''}{"b64_json":"`;
    yield* inPieces(b64_json);
    yield others === '}' ? '"}' : `",${others}`;
  }
  yield ']}';
}
