import { randomBytes } from 'node:crypto';
import { IMAGE_EXTENSIONS, IMAGE_FORMATS, type ImageExtension } from '../runtime/types.js';
import { IMAGE_ID, type StoredImage } from './image-store.js';

/**
 * How both stores name an image: `<id>.<expiry unix milliseconds>.<ext>`, a file name or an object key
 * after the prefix. The name is the whole index: a directory or bucket listing gives every image's id,
 * expiry, type and size, so a restart (or another replica) rebuilds the index, and the sweeper finds
 * expired images, without reading any image.
 */

const EXTENSIONS = Object.fromEntries(Object.values(IMAGE_FORMATS).map((f) => [f.contentType, f.extension])) as Record<string, ImageExtension>;
const CONTENT_TYPES = Object.fromEntries(Object.values(IMAGE_FORMATS).map((f) => [f.extension, f.contentType])) as Record<ImageExtension, string>;

const NAME = new RegExp(`^(${IMAGE_ID})\\.(\\d+)\\.(${IMAGE_EXTENSIONS.join('|')})$`);

/** The extension of images of `contentType`; throws for a type no image name can carry. */
export function extensionOf(contentType: string): ImageExtension {
  const ext = EXTENSIONS[contentType];
  if (!ext) throw new TypeError(`cannot store images of type ${contentType}`);
  return ext;
}

/** A new image of `size` bytes living `ttlSeconds` from `now`, with a fresh random id (IMAGE_ID's 32 hex digits). */
export function newImage(ext: ImageExtension, contentType: string, size: number, now: number, ttlSeconds: number): StoredImage {
  return { id: randomBytes(16).toString('hex'), ext, contentType, expiresAt: now + Math.round(ttlSeconds * 1000), size };
}

/** Whether an image's time is up at `now` (unix milliseconds). */
export function isExpired(image: Pick<StoredImage, 'expiresAt'>, now: number): boolean {
  return image.expiresAt <= now;
}

export function imageName(image: Pick<StoredImage, 'id' | 'expiresAt' | 'ext'>): string {
  return `${image.id}.${image.expiresAt}.${image.ext}`;
}

/** The image a name stands for, or undefined for a name that is not an image's (temporary files, strangers). */
export function parseImageName(name: string): Omit<StoredImage, 'size'> | undefined {
  const match = NAME.exec(name);
  if (!match) return undefined;
  const [, id, expiry, ext] = match;
  return { id, ext: ext as ImageExtension, contentType: CONTENT_TYPES[ext as ImageExtension], expiresAt: Number(expiry) };
}
