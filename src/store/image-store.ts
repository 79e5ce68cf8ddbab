import type { ImageExtension } from '../runtime/types.js';

/**
 * Where generated images live while their URLs are valid: what the image service and the files route
 * need of a store. The filesystem store (file-store.ts) is the one there is; an object store would be
 * another implementation of this interface.
 */

export interface StoredImage {
  id: string;
  ext: ImageExtension;
  contentType: string;
  /** Unix milliseconds; the image is gone from this moment on. */
  expiresAt: number;
  size: number;
}

/** Image ids are 32 hex digits (128 random bits). */
export const IMAGE_ID = '[0-9a-f]{32}';

export class StoreFullError extends Error {
  constructor(readonly maxBytes: number) {
    super(`the image store is full (${maxBytes} bytes of unexpired images)`);
    this.name = 'StoreFullError';
  }
}

/**
 * Space set aside before images are generated, so that a full store refuses a request before any work
 * is spent on it. Puts made with it draw on it first; release() returns what they did not use.
 */
export interface StoreReservation {
  /** Bytes still set aside. */
  readonly bytes: number;
  release(): void;
}

export interface ImageStore {
  /** Sets `bytes` aside for images to come; throws StoreFullError when they do not fit even after a sweep. */
  reserve(bytes: number): Promise<StoreReservation>;
  /**
   * Stores an image until its expiry, drawing on `reservation` first; throws StoreFullError when it
   * does not fit even after a sweep.
   */
  put(data: Uint8Array, contentType: string, reservation?: StoreReservation): Promise<StoredImage>;
  /** The image, or null when unknown or expired (even before a sweep deleted it). */
  get(id: string): StoredImage | null;
  /** The image's bytes, or null if it expired or vanished meanwhile. */
  read(image: StoredImage): Promise<Buffer | null>;
  /** Deletes images before they expire: ones no response will name after all. */
  remove(images: StoredImage[]): Promise<void>;
  /** Deletes expired images. */
  sweep(): Promise<void>;
  /** Images and bytes held, for metrics. */
  stats(): { files: number; bytes: number };
  /** The store's clock, unix milliseconds: expiry is measured on it. */
  now(): number;
  close(): Promise<void>;
}
