import type { FastifyInstance, FastifyRequest } from 'fastify';
import parseRange from 'range-parser';
import { IMAGE_EXTENSIONS } from '../runtime/types.js';
import { IMAGE_ID, ImageDamagedError, StoreUnavailableError, type ByteRange, type ImageStore, type StoredImage } from '../store/image-store.js';
import { ApiError } from '../api/errors.js';
import { storeUnavailable } from '../service/failures.js';

/**
 * Serves stored images without an API key, so a plain <img src> works, for as long as they live,
 * streamed from the store (with STORE=s3 any replica serves any replica's images). The file name is
 * checked against a strict pattern before it reaches the store: nothing else names a file, so no path
 * can escape the store's folder.
 */

export interface FilesOptions {
  store: ImageStore;
}

const PREFIX = '/v1/images/files/';
const FILE_NAME = new RegExp(`^(${IMAGE_ID})\\.(${IMAGE_EXTENSIONS.join('|')})$`);

/** The path of a stored image's URL. */
export function imagePath(image: StoredImage): string {
  return `${PREFIX}${image.id}.${image.ext}`;
}

/** Why an image file is a 404: `EXPIRED` (or never made), or `DAMAGED`, which is gone as an expired one is (same code). */
const EXPIRED = 'does not exist or has expired (images live for a limited time after generation).';
const DAMAGED = 'can no longer be served: its stored copy was found damaged (not the bytes it was generated with). Please generate it again.';

function notFound(name: string, why = EXPIRED): ApiError {
  return new ApiError(404, `The image '${name}' ${why}`, { code: 'image_not_found' });
}

/** The unexpired image `id`, if it has extension `ext`. */
async function findImage(store: ImageStore, id: string, ext: string): Promise<StoredImage | null> {
  const image = await store.get(id);
  return image && image.ext === ext ? image : null;
}

/**
 * Whether If-None-Match names `etag` (or is `*`). An image never changes under its id, so its id is a
 * strong ETag and a weak comparison (W/ ignored) is all RFC 9110 asks for GET; a few lines, no library.
 */
function matchesEtag(header: string | undefined, etag: string): boolean {
  if (!header) return false;
  return header.split(',').some((tag) => {
    const candidate = tag.trim().replace(/^W\//, '');
    return candidate === '*' || candidate === etag;
  });
}

/**
 * The part of the image a GET asks for with Range: undefined for all of it, also where RFC 9110 lets a
 * server answer whole (a malformed header, another unit, several ranges: multipart/byteranges buys
 * nothing for an image) and where If-Range names another copy than this one (an image never changes
 * under its id, and a date never matches: no Last-Modified is sent). range-parser (Express's) reads
 * the header's forms: `a-b`, `a-`, `-n`.
 */
function requestedRange(headers: FastifyRequest['headers'], size: number, etag: string): ByteRange | 'unsatisfiable' | undefined {
  const header = headers.range;
  if (!header) return undefined;
  const ifRange = headers['if-range'];
  if (ifRange !== undefined && (typeof ifRange !== 'string' || ifRange.trim() !== etag)) return undefined;
  // A range whose last byte comes before its first makes the header invalid, to be ignored (RFC 9110
  // 14.1.1); range-parser drops such a range and answers -1 as for one past the end, so it is told apart
  // here, range by range as range-parser reads them. Each pattern is anchored at its range's start: one
  // searched for anywhere in the header took time quadratic in its length (a 16 KiB header of digits
  // held the server's one thread for a quarter of a second, on a route that needs no key).
  const backwards = (range: string) => {
    const [, first, last] = /^\s*(\d+)\s*-\s*(\d+)/.exec(range) ?? [];
    return last !== undefined && Number(last) < Number(first);
  };
  if (header.slice(header.indexOf('=') + 1).split(',').some(backwards)) return undefined;
  // A suffix longer than the image asks for all of it (RFC 9110 14.1.2), which range-parser answers -1,
  // as for one past the end: such a suffix is cut to the image's size here.
  const suffixesCut = header.replace(/(^[^=]*=|,)(\s*)-\s*(\d+)/g, (form, before: string, space: string, length: string) =>
    Number(length) > size ? `${before}${space}-${size}` : form,
  );
  const ranges = parseRange(size, suffixesCut, { combine: true });
  if (ranges === -1) return 'unsatisfiable';
  if (ranges === -2 || ranges.type !== 'bytes' || ranges.length !== 1) return undefined;
  return ranges[0];
}

function unsatisfiable(range: string, size: number): ApiError {
  return new ApiError(416, `The range '${range}' names no byte of the image's ${size} (bytes are counted from 0).`, {
    code: 'range_not_satisfiable',
    headers: { 'content-range': `bytes */${size}` },
  });
}

export async function files(app: FastifyInstance, { store }: FilesOptions): Promise<void> {
  // HEAD is routed here too, not left to Fastify's own HEAD route, which would run the GET (reading the
  // image) and then answer Content-Length: 0 for the body this handler leaves out.
  app.route<{ Params: { name: string } }>({
    method: ['GET', 'HEAD'],
    url: `${PREFIX}:name`,
    config: { public: true },
    handler: async (request, reply) => {
      const { name } = request.params;
      const match = FILE_NAME.exec(name);
      if (!match) throw notFound(name);
      // A store that cannot be reached is a retryable 503 in OpenAI's shape, not a 404 that says the image
      // is gone; a damaged image is a 404 that says so, never a 200 with part of it.
      const asApiError = (err: unknown): never => {
        if (err instanceof ImageDamagedError) throw notFound(name, DAMAGED);
        throw err instanceof StoreUnavailableError ? storeUnavailable(err, 'Please retry shortly.') : err;
      };
      const image = await findImage(store, match[1], match[2]).catch(asApiError);
      if (!image) throw notFound(name);
      const etag = `"${image.id}"`;
      // Only answers that are the image say it may be cached: a 404, 416 or 503 must not be kept as it.
      const asImage = () => {
        const maxAge = Math.max(0, Math.floor((image.expiresAt - store.now()) / 1000));
        return reply.header('etag', etag).header('cache-control', `public, max-age=${maxAge}, immutable`).header('x-content-type-options', 'nosniff').header('accept-ranges', 'bytes');
      };
      // A client (a cache, a browser's reload) that has the image already gets no second copy; a HEAD
      // gets the headers. Neither reads the image (with STORE=s3 that would download it to discard it).
      const fresh = matchesEtag(request.headers['if-none-match'], etag);
      if (fresh || request.method === 'HEAD') {
        if (!(await store.has(image).catch(asApiError))) throw notFound(name);
        return fresh ? asImage().code(304).send() : asImage().type(image.contentType).header('content-length', image.size).send();
      }
      const range = requestedRange(request.headers, image.size, etag);
      if (range === 'unsatisfiable') throw unsatisfiable(request.headers.range!, image.size);
      const data = await store.read(image, range).catch(asApiError);
      if (!data) throw notFound(name);
      asImage().type(image.contentType);
      if (!range) return reply.header('content-length', image.size).send(data);
      // A part: a download that broke off resumes where it stopped, a viewer fetches what it shows.
      return reply
        .code(206)
        .header('content-range', `bytes ${range.start}-${range.end}/${image.size}`)
        .header('content-length', range.end - range.start + 1)
        .send(data);
    },
  });
}
