import { outputOf, type GenerationBatch, type OutputFormat } from '../runtime/types.js';
import { sumOverImages } from './image-bytes.js';

/**
 * The most an answer that carries its images (b64_json, a stream's events) may take, worked out before
 * any of them is made: the HTTP layer sets it aside of ANSWER_MEMORY first (GenerateContext.reserveAnswer),
 * so that the answers of requests admitted together cannot pass it once made. A bound, not an estimate
 * (store-space.ts's is one): an answer larger than its reservation would be in memory already.
 */

/**
 * Bytes per pixel a file of each format takes at most, with the server's encoder settings
 * (pipelines/encode-image.ts) at quality 100. PNG: zlib's level 1 writes fixed Huffman codes, at most
 * 9 bits a byte (3.375 a pixel, and a filter byte a row); random pixels took 3.21. JPEG: libjpeg-turbo's
 * own worst case for 4:2:0, sharp's subsampling, is 3. WebP has no stated bound: random pixels of 0 and
 * 255 took 3.13, the most of the pictures tried.
 */
const MOST_BYTES_PER_PIXEL: Record<OutputFormat, number> = { png: 3.5, jpeg: 3, webp: 4 };
/** A file's headers and chunks besides its pixels. */
const FILE_BYTES = 4096;
/** What a streamed image's event adds to its base64 (its JSON fields: size, usage, settings). */
const EVENT_BYTES = 1024;
/** A stream's other lines together: progress, keep-alives, an error. */
const STREAM_LINES_BYTES = 64 * 1024;

const base64Bytes = (bytes: number) => 4 * Math.ceil(bytes / 3);

/**
 * The bytes an answer takes to repeat the request's safety identifier (its `safety_identifier`, else its
 * `user`; gpt-image-fields.ts), as JSON writes it: a control character, one byte of a form field, takes
 * six. It is the client's text, of any length (`user` has no limit, as at OpenAI, but BODY_LIMIT's): a
 * `user` of 1 MB made each of a stream's ten completed events a megabyte larger than its reservation.
 */
export const echoedBytes = (safetyIdentifier: string | undefined): number => (safetyIdentifier ? Buffer.byteLength(JSON.stringify(safetyIdentifier)) : 0);

/**
 * The most the answer of `batches` may hold: their images in base64, and for a stream (`stream`) each
 * image's previews too (BatchItem.partialImages), each in its event, and its other lines; and the
 * request's `safetyIdentifier` as the answer repeats it (echoedBytes): once in a JSON answer, in each
 * image's completed event of a stream.
 */
export function mostAnswerBytes(batches: readonly GenerationBatch[], stream: boolean, safetyIdentifier?: string): number {
  const event = stream ? EVENT_BYTES : 0;
  const echoed = echoedBytes(safetyIdentifier);
  const images = sumOverImages(batches, (pixels, item) => {
    const file = base64Bytes(Math.ceil(pixels * MOST_BYTES_PER_PIXEL[outputOf(item).format]) + FILE_BYTES);
    return (1 + (item.partialImages ?? 0)) * (file + event) + (stream ? echoed : 0);
  });
  return stream ? images + STREAM_LINES_BYTES : images + echoed;
}
