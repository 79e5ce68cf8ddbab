import { createHash, randomBytes } from 'node:crypto';
import { IMAGE_EXTENSIONS, IMAGE_FORMATS, type ImageExtension } from '../runtime/types.js';
import { IMAGE_ID, type StoredImage } from './image-store.js';
import { OWNER_DIGITS } from './image-owner.js';

/**
 * How both stores name an image: `<id>.<expiry unix milliseconds>.<ext>`, a file name or an object key
 * after the prefix. The name is the whole index: a directory or bucket listing gives every image's id,
 * expiry, type and size, so a restart (or another replica) rebuilds the index, and the sweeper finds
 * expired images, without reading any image.
 *
 * An image that has a digest (the file store's) carries its record too, `<id>.<expiry>.<size>.<digest>.<ext>`:
 * the bytes it was stored with, told apart from a file cut short or changed while no server ran (a restore
 * that broke off), which the file's own size cannot tell. It comes with the name in the same rename, so
 * no image is ever on disk without it; names without it (images stored before it was added, S3's objects,
 * whose listing gives their size and which are never half written) are read without a size, which the
 * listing or the file then gives.
 *
 * An image made for an API key carries its owner too, `...[.<size>.<digest>].k<owner>.<ext>` (see
 * image-owner.ts): each key may hold only a share of the store (space.ts), and the share must hold across
 * restarts and replicas sharing the folder or bucket, which know the images only by these names. Names
 * without it (images of a server without keys, or stored before owners were recorded) are nobody's:
 * served and counted against the whole store as before, against no key's share.
 */

const EXTENSIONS = Object.fromEntries(Object.values(IMAGE_FORMATS).map((f) => [f.contentType, f.extension])) as Record<string, ImageExtension>;
const CONTENT_TYPES = Object.fromEntries(Object.values(IMAGE_FORMATS).map((f) => [f.extension, f.contentType])) as Record<ImageExtension, string>;

/** 64 bits: enough to tell a damaged copy, short enough for a file name. */
const DIGEST_DIGITS = 16;
const NAME = new RegExp(
  `^(${IMAGE_ID})\\.(\\d+)(?:\\.(\\d+)\\.([0-9a-f]{${DIGEST_DIGITS}}))?(?:\\.k([0-9a-f]{${OWNER_DIGITS}}))?\\.(${IMAGE_EXTENSIONS.join('|')})$`,
);

/** An image as its name gives it: with its size where the name records it. */
export type NamedImage = Omit<StoredImage, 'size'> & { size?: number };

/** The extension of images of `contentType`; throws for a type no image name can carry. */
export function extensionOf(contentType: string): ImageExtension {
  const ext = EXTENSIONS[contentType];
  if (!ext) throw new TypeError(`cannot store images of type ${contentType}`);
  return ext;
}

/** A new image of `size` bytes living `ttlSeconds` from `now`, with a fresh random id (IMAGE_ID's 32 hex digits), of `owner` (nameableOwner's). */
export function newImage(ext: ImageExtension, contentType: string, size: number, now: number, ttlSeconds: number, owner: string | undefined): StoredImage {
  return { id: randomBytes(16).toString('hex'), ext, contentType, expiresAt: now + Math.round(ttlSeconds * 1000), size, ...(owner !== undefined && { owner }) };
}

/** Whether an image's time is up at `now` (unix milliseconds). */
export function isExpired(image: Pick<StoredImage, 'expiresAt'>, now: number): boolean {
  return image.expiresAt <= now;
}

export function imageName(image: Pick<StoredImage, 'id' | 'expiresAt' | 'ext' | 'size' | 'digest' | 'owner'>): string {
  const record = image.digest === undefined ? '' : `.${image.size}.${image.digest}`;
  const owner = image.owner === undefined ? '' : `.k${image.owner}`;
  return `${image.id}.${image.expiresAt}${record}${owner}.${image.ext}`;
}

/** The digest of an image's bytes (the first DIGEST_DIGITS hex digits of their SHA-256), from its bytes in memory or a file's stream. */
export async function digestOf(chunks: Iterable<Uint8Array> | AsyncIterable<Uint8Array>): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of chunks) hash.update(chunk);
  return hash.digest('hex').slice(0, DIGEST_DIGITS);
}

/** The image a name stands for, or undefined for a name that is not an image's (temporary files, strangers). */
export function parseImageName(name: string): NamedImage | undefined {
  const match = NAME.exec(name);
  if (!match) return undefined;
  const [, id, expiry, size, digest, owner, ext] = match;
  const named = { id, ext: ext as ImageExtension, contentType: CONTENT_TYPES[ext as ImageExtension], expiresAt: Number(expiry), ...(owner !== undefined && { owner }) };
  return digest === undefined ? named : { ...named, size: Number(size), digest };
}
