import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Multipart } from '@fastify/multipart';
import { imageReferenceBytes } from '../api/data-uri.js';
import { ApiError, describeValue } from '../api/errors.js';
import { isRequestField, meansNull, UNSUPPORTED_FIELDS } from '../api/wire.js';
import type { ByteBudget } from '../util/byte-budget.js';
import { holdBodyMemory } from './body-memory.js';
import { declaredBodyBytes } from './connections.js';
import { messageOf } from '../util/error-message.js';

/**
 * The body of an edits or variations request as sent, in either of OpenAI's forms: a multipart form
 * (files `image` or `image[]`, and `mask`; every other part a text field) or, for edits, JSON with
 * `images: [{image_url}]` and `mask: {image_url}` as data: URIs. The fields go on to the request's
 * schema, the files to input-images.ts; this module only separates them and bounds their size.
 */

/**
 * Largest uploaded file: OpenAI takes gpt-image input images of less than 50 MB each (dall-e-2's of 4 MB),
 * so a drop-in takes every one of them; a 4096 x 4096 photo as PNG (the pixel limit, input-images.ts) is
 * often 30 to 50 MB. What a file weighs bounds only its upload: its decode is bounded by its pixels.
 */
export const MAX_UPLOAD_BYTES = 50 * 1024 ** 2;
/** A prompt is at most 32000 characters, up to 4 bytes each in UTF-8. */
const MAX_FIELD_BYTES = 128 * 1024;
const MAX_FIELDS = 64;

export type UploadRoute = 'edit' | 'variation';

export interface UploadedFile {
  bytes: Buffer;
  /** How errors name it: `image`, `image[1]`, `images[0].image_url`, `mask`. */
  param: string;
}

/** What the route takes: `maxImages` image files at most; a form's next one is refused, with `tooMany`'s error, before it is read. */
export interface UploadLimits {
  maxImages: number;
  tooMany(param: string): ApiError;
}

export interface Upload {
  fields: Record<string, unknown>;
  /** The fields are a form's strings, not JSON values. */
  form: boolean;
  images: UploadedFile[];
  mask?: UploadedFile;
}

const FILE_FIELDS: Record<UploadRoute, readonly string[]> = { edit: ['image', 'image[]', 'mask'], variation: ['image'] };

const isFileTooLarge = (err: unknown) => (err as { code?: string }).code === 'FST_REQ_FILE_TOO_LARGE';

/** A file over the limit; `param` names it where known. */
const fileTooLarge = (param: string | null) =>
  new ApiError(413, `An uploaded file${param ? ` ('${param}')` : ''} is too large: the limit is ${MAX_UPLOAD_BYTES / 1024 ** 2} MiB per file. Send a smaller image.`, { code: 'request_too_large', param });

/** A file part's bytes; one over the limit is a 413 naming it. */
async function fileBytes(part: Extract<Multipart, { type: 'file' }>, param: string): Promise<Buffer> {
  const bytes = await part.toBuffer().catch((err: unknown) => {
    throw isFileTooLarge(err) ? fileTooLarge(param) : err;
  });
  // toBuffer sees the limit only in a chunk read after the parser cut the file: when the bytes read so
  // far end exactly at the limit, it resolves with them, and the error comes from the form's end,
  // where it can no longer say which file it was.
  if (part.file.truncated) throw fileTooLarge(param);
  return bytes;
}

/** What fixes a form's Content-Type that does not name the boundary its body uses. */
const LET_THE_CLIENT_SET_IT =
  "Let the HTTP client set the Content-Type of a form: it writes the boundary it chose there (with fetch and FormData, or Python requests' files=, set no Content-Type header).";

/**
 * @fastify/multipart's and busboy's errors in OpenAI's terms: its limits are 413s, a broken form a 400.
 * A Content-Type written by hand (`multipart/form-data` alone, or copied from another request) names no
 * boundary or another one than the body's, which the parser reports as no boundary or as an end of the
 * data before any part (`partSeen` false): those say what to do about it.
 */
function formError(err: unknown, partSeen: boolean): unknown {
  if (err instanceof ApiError) return err;
  const code = (err as { code?: string }).code;
  if (isFileTooLarge(err)) return fileTooLarge(null);
  if (code === 'FST_PARTS_LIMIT' || code === 'FST_FIELDS_LIMIT') {
    return new ApiError(413, `The form has too many parts: at most ${MAX_FIELDS} text fields are read.`, { code: 'request_too_large' });
  }
  const message = messageOf(err);
  // busboy searches for the boundary with streamsearch, which takes at most 256 bytes of it (and words
  // its refusal for its own callers: "The needle cannot have a length bigger than 256.").
  if (message.startsWith('The needle cannot have a length bigger than')) {
    return new ApiError(400, `The boundary= of the Content-Type multipart/form-data is too long: RFC 2046 allows at most 70 characters. ${LET_THE_CLIENT_SET_IT}`, { code: 'invalid_multipart' });
  }
  if (message === 'Multipart: Boundary not found') {
    return new ApiError(400, `The Content-Type multipart/form-data names no boundary= (the line that separates the form's parts). ${LET_THE_CLIENT_SET_IT}`, { code: 'invalid_multipart' });
  }
  if (message === 'Unexpected end of multipart data' && !partSeen) {
    return new ApiError(400, `The multipart/form-data body has no part that begins with the boundary its Content-Type names: it uses another boundary, or it is empty or cut short. ${LET_THE_CLIENT_SET_IT}`, { code: 'invalid_multipart' });
  }
  return new ApiError(400, `The multipart/form-data body could not be read: ${message}.`, { code: 'invalid_multipart' });
}

function readText(part: Extract<Multipart, { type: 'field' }>, fields: Record<string, unknown>): void {
  if (part.valueTruncated || part.fieldnameTruncated) {
    throw new ApiError(413, `The form field '${part.fieldname}' is too large: the limit is ${MAX_FIELD_BYTES} bytes.`, { code: 'request_too_large' });
  }
  if (part.fieldname in fields) {
    throw ApiError.invalid(part.fieldname, 'invalid_value', `The form field '${part.fieldname}' was sent more than once; send it once.`);
  }
  // The parser decodes a part without a charset as UTF-8, each byte that is not UTF-8 as U+FFFD: a prompt
  // in another encoding (curl on Windows sends -F values in the console's code page) would be drawn with
  // replacement characters in it, as content.ts refuses for a JSON body. A part naming its charset is
  // decoded by it, but only where busboy has a decoder of that name (UTF-8, Latin-1 and its aliases,
  // UTF-16LE): it reads every other named charset (windows-1251, Shift_JIS) as UTF-8, so the message
  // names the ones that work rather than advise naming any.
  if (typeof part.value === 'string' && part.value.includes('\uFFFD')) {
    throw ApiError.invalid(
      part.fieldname,
      'invalid_encoding',
      `The form field '${part.fieldname}' is not valid UTF-8 (it has bytes that are not, or U+FFFD, the replacement character they decode to). Send form fields in UTF-8; a part whose Content-Type names charset ISO-8859-1 (windows-1252) or UTF-16LE is read in it, any other charset as UTF-8. With curl on Windows, put the text in a UTF-8 file and send -F '${part.fieldname}=<file.txt'.`,
    );
  }
  fields[part.fieldname] = part.value;
}

/** Part headers and boundaries: a form's bytes beyond its files and fields. */
const FORM_OVERHEAD_BYTES = 1024 ** 2;

/**
 * Bounds the bytes a form may send, all of them: the parser counts files and fields but skips what comes
 * before the first part and after the last without counting, so a client could make the server read
 * gigabytes. A declared length over the bound is refused before anything is read. Otherwise the body is
 * counted as it comes, to its end: past the bound while the parts are read, the request stream's error
 * ends them with a 413 (@fastify/multipart listens for it) and the connection closes, the rest unread;
 * past it after the form's end (junk after its last boundary, while the request runs), the connection is
 * cut. Answers a function to call once the parts are read.
 *
 * Every byte of its parts is taken from `memory` (UPLOAD_MEMORY, body-memory.ts) and given back when the
 * request ends: the files stay in memory while the request waits for a worker, and nothing else bounds
 * how many requests do. A form that finds it full is answered with a 429 to retry before the rest is
 * read (which is then dropped as it comes, connections.ts).
 */
function boundFormBytes(request: FastifyRequest, reply: FastifyReply, maxBytes: number, memory: ByteBudget): () => void {
  // Declared too large, the body is answered before it comes (and the rest read and dropped within
  // bounds, connections.ts); found too large as it comes, the connection closes after the answer.
  const tooLarge = (close: boolean) =>
    new ApiError(413, `The multipart/form-data body is larger than any form this endpoint takes (at most ${Math.ceil(maxBytes / 1024 ** 2)} MiB).`, {
      code: 'request_too_large',
      ...(close && { headers: { connection: 'close' } }),
    });
  if (declaredBodyBytes(request) > maxBytes) throw tooLarge(false);
  /** Takes the bytes read into its parts from `memory` (what comes after them is dropped). */
  const take = holdBodyMemory(request, reply, memory);
  const raw = request.raw;
  let received = 0;
  let partsRead = false;
  const refuse = (error: ApiError) => {
    raw.off('data', count);
    if (partsRead) raw.socket.destroy();
    else {
      raw.pause();
      raw.emit('error', error);
    }
  };
  const count = (chunk: Buffer) => {
    if (received + chunk.byteLength > maxBytes) return refuse(tooLarge(true));
    received += chunk.byteLength;
    if (partsRead) return;
    const refusal = take(chunk.byteLength);
    if (refusal) return refuse(refusal);
  };
  // The answer is done (or the client left): a refused form's body may still be arriving, and is no
  // longer counted (what it held goes back: holdBodyMemory).
  reply.raw.once('close', () => raw.off('data', count));
  // A 'data' listener sets the stream flowing, but only from the next tick: readParts pipes it into the
  // form parser before then (its first step runs synchronously), so no chunk reaches this count alone.
  raw.on('data', count);
  raw.once('end', () => raw.off('data', count));
  return () => {
    partsRead = true;
    // The parser let go of the stream: what is left is read (and counted) here, not left to block it.
    if (!raw.readableEnded) raw.resume();
  };
}

/** The most bytes a form of `route` may send (boundFormBytes holds it to them): its files, fields and part headers. */
export function formBound(route: UploadRoute, limits: UploadLimits): number {
  const files = limits.maxImages + (FILE_FIELDS[route].includes('mask') ? 1 : 0);
  return files * MAX_UPLOAD_BYTES + MAX_FIELDS * MAX_FIELD_BYTES + FORM_OVERHEAD_BYTES;
}

async function readForm(request: FastifyRequest, reply: FastifyReply, route: UploadRoute, limits: UploadLimits, memory: ByteBudget): Promise<Upload> {
  const partsRead = boundFormBytes(request, reply, formBound(route, limits), memory);
  try {
    return await readParts(request, route, limits);
  } finally {
    partsRead();
  }
}

async function readParts(request: FastifyRequest, route: UploadRoute, limits: UploadLimits): Promise<Upload> {
  const upload: Upload = { fields: {}, form: true, images: [] };
  // No limit on the number of files: beyond the route's images and one mask, the next is refused unread.
  const parts = request.parts({ limits: { fileSize: MAX_UPLOAD_BYTES, fields: MAX_FIELDS, fieldSize: MAX_FIELD_BYTES } });
  let partSeen = false;
  try {
    for await (const part of parts) {
      partSeen = true;
      if (!part.fieldname) {
        throw new ApiError(400, 'A part of the multipart/form-data body has no name (its Content-Disposition lacks name="..."): name every field and file.', { code: 'invalid_multipart' });
      }
      // Null, as openai-node tells its callers to send it in a form (a GIF or SVG field too, then omitted).
      if (part.type === 'field' && meansNull(route, part.fieldname, part.value)) continue;
      // OpenAI's fields this server has no use for say why: as a file (an edit's markup), and as the nested
      // fields the SDKs make of an object (svg[model]), which would read as unknown ones.
      const root = part.fieldname.replace(/\[.*/s, '');
      if (Object.hasOwn(UNSUPPORTED_FIELDS, root)) {
        throw ApiError.invalid(root, 'unsupported_parameter', UNSUPPORTED_FIELDS[root as keyof typeof UNSUPPORTED_FIELDS]);
      }
      if (part.type === 'field') {
        // An image sent as text (a URL, a path) must not read as an unknown field. Nor must the field per
        // byte (image[0], image[1], ...) that openai-node makes of a Buffer or Uint8Array passed as the
        // file itself, which past the 64th field would be a 413 for too many parts that says nothing of it;
        // in a list of images, image[][0], image[][1], ...
        const perByte = /^[a-z]+(\[\])?\[\d+\]$/.test(part.fieldname) && FILE_FIELDS[route].includes(root);
        if (FILE_FIELDS[route].includes(part.fieldname) || perByte) {
          const file = perByte ? root : part.fieldname;
          const hint = perByte ? ` ('${part.fieldname}' is what openai-node sends for a Buffer or Uint8Array passed as the file itself: pass await toFile(bytes, 'picture.png') instead)` : '';
          throw ApiError.invalid(file, 'invalid_type', `Invalid type for '${file}': expected an image file upload, but got a text field instead${hint}.`);
        }
        readText(part, upload.fields);
        continue;
      }
      // A text field sent as a file (curl's -F prompt=@prompt.txt uploads the file) is no unknown parameter.
      if (isRequestField(route, part.fieldname)) {
        throw ApiError.invalid(
          part.fieldname,
          'invalid_type',
          `Invalid type for '${part.fieldname}': expected a text field, but got a file upload instead. Send its value as text (with curl, -F '${part.fieldname}=<file.txt' sends a file's text as the field; -F '${part.fieldname}=@file.txt' uploads the file).`,
        );
      }
      if (!FILE_FIELDS[route].includes(part.fieldname)) {
        throw ApiError.invalid(part.fieldname, 'unknown_parameter', `Unknown parameter: '${part.fieldname}' (a file). The files this endpoint takes are: ${FILE_FIELDS[route].map((f) => `'${f}'`).join(', ')}.`);
      }
      // An HTML form's file input left empty sends a part with no file name and no bytes: omitted, as its
      // user meant (no mask chosen), where it was refused as an empty file.
      const unchosen = part.filename === '' ? await fileBytes(part, part.fieldname) : undefined;
      if (unchosen?.length === 0) continue;
      const bytes = (param: string) => unchosen ?? fileBytes(part, param);
      // Files the route will not take are refused before they are read into memory.
      if (part.fieldname === 'mask') {
        if (upload.mask) throw ApiError.invalid('mask', 'invalid_value', "The file 'mask' was sent more than once; send one mask.");
        upload.mask = { bytes: await bytes('mask'), param: 'mask' };
      } else {
        if (upload.images.length >= limits.maxImages) throw limits.tooMany('image');
        const param = upload.images.length === 0 ? 'image' : `image[${upload.images.length}]`;
        upload.images.push({ bytes: await bytes(param), param });
      }
    }
  } catch (err) {
    throw formError(err, partSeen);
  }
  return upload;
}

function readJson(body: unknown): Upload {
  // Not an object: the request's schema says so in OpenAI's words.
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return { fields: body as Record<string, unknown>, form: false, images: [] };
  const { images, mask, ...fields } = body as Record<string, unknown>;
  // The form's file field, sent in JSON (a data: URI or {"image_url"}): unknown here, and the answer says what JSON takes instead.
  if (fields.image !== undefined && fields.image !== null) {
    throw ApiError.invalid(
      'image',
      'unknown_parameter',
      `Unknown parameter: 'image'. A JSON edit sends its picture as 'images': [{"image_url": "data:image/png;base64,..."}] ('image' is the file of a multipart form).`,
    );
  }
  if (images !== undefined && images !== null && !Array.isArray(images)) {
    throw ApiError.invalid('images', 'invalid_type', `Invalid type for 'images': expected an array of {"image_url": "data:..."} objects, but got ${describeValue(images)} instead.`);
  }
  // Sent, so not "missing": OpenAI's words for an array under its minimum length (its schema's minItems 1).
  if (Array.isArray(images) && images.length === 0) {
    throw ApiError.invalid('images', 'empty_array', "Invalid 'images': empty array. Expected an array with minimum length 1, but got an empty array instead.");
  }
  return {
    fields,
    form: false,
    images: (images ?? []).map((reference: unknown, i: number) => ({ bytes: imageReferenceBytes(reference, `images[${i}]`), param: `images[${i}].image_url` })),
    ...(mask !== undefined && mask !== null && { mask: { bytes: imageReferenceBytes(mask, 'mask'), param: 'mask' } }),
  };
}

/**
 * The request's fields and files, in whichever form it came (edits.ts refuses JSON for variations). A
 * form's bytes are taken from `memory` until the request ends (JSON bodies are bounded by BODY_LIMIT,
 * and read before any route runs).
 */
export async function readUpload(request: FastifyRequest, reply: FastifyReply, route: UploadRoute, limits: UploadLimits, memory: ByteBudget): Promise<Upload> {
  return request.isMultipart() ? readForm(request, reply, route, limits, memory) : readJson(request.body);
}
