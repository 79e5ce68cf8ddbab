import type { Readable } from 'node:stream';
import type { Logger } from 'pino';
import type { ImageExtension } from '../runtime/types.js';

/**
 * Where generated images live while their URLs are valid: what the image service, the files route and
 * the readiness probe need of a store. Two implementations: a folder on this machine (file-store.ts)
 * and an S3-compatible bucket that replicas share (s3-store.ts); STORE picks one (open-store.ts).
 */

export interface StoredImage {
  id: string;
  ext: ImageExtension;
  contentType: string;
  /** Unix milliseconds; the image is gone from this moment on. */
  expiresAt: number;
  size: number;
  /**
   * The first 64 bits of the image's SHA-256 in hex, where its store records it to tell a damaged copy
   * (the file store, in the file name with the size: see image-names.ts).
   */
  digest?: string;
  /**
   * Where clients fetch the image instead of the server's files route, when the store hands out
   * addresses of its own (S3 presigned URLs, valid until the image expires).
   */
  url?: string;
  /**
   * The API key whose request made it, as an opaque id (image-owner.ts's imageOwner), kept in its name so
   * that every replica and restart counts each key's share of the store alike; none for images of a
   * server without keys, and those stored before owners were recorded (nobody's).
   */
  owner?: string;
}

/** Image ids are 32 hex digits (128 random bits). */
export const IMAGE_ID = '[0-9a-f]{32}';

/** Why a store refused images. */
export type StoreFullReason =
  /** Full of unexpired images: room comes back as they expire. */
  | 'images'
  /** It would fit but for space set aside for images being generated now: once those are stored, what they did not use is free again. */
  | 'running'
  /** More than the whole store (its byte limit) can hold: no waiting helps. */
  | 'too-large'
  /** The disk under the store has no room left, whatever the store's byte limit. */
  | 'disk'
  /** The API key's images (and requests running now) take as much of the store as one key may (see StoreSpace): other keys' still fit. */
  | 'share';

/** A key's share of the store, where a refusal was for it ('share'). */
export interface KeyShare {
  /** What one key may hold (half the store, or the refused request's images where that is more). */
  bytes: number;
  /** Whether the space the key's running requests set aside is what is missing (it comes back as they end), rather than its stored images. */
  running: boolean;
}

/** What a refusal says beyond its reason; the optional values only where the reason gives them. */
export type StoreFullDetails = Pick<StoreFullError, 'maxBytes' | 'neededBytes'> & Partial<Pick<StoreFullError, 'retryAfterSeconds' | 'freeBytes' | 'share'>>;

export class StoreFullError extends Error {
  /** The store's byte limit (MAX_STORE_BYTES). */
  readonly maxBytes: number;
  /** What the refused images needed. */
  readonly neededBytes: number;
  /** When images expiring frees enough room, where the store knows ('images'). */
  readonly retryAfterSeconds: number | undefined;
  /** What the disk had free, where the store looked ('disk', as space is set aside). */
  readonly freeBytes: number | undefined;
  /** The key's share ('share'). */
  readonly share: KeyShare | undefined;
  constructor(readonly reason: StoreFullReason, details: StoreFullDetails) {
    super(`the image store cannot take ${details.neededBytes} more bytes (${reason}; its limit is ${details.maxBytes} bytes)`);
    this.name = 'StoreFullError';
    this.maxBytes = details.maxBytes;
    this.neededBytes = details.neededBytes;
    this.retryAfterSeconds = details.retryAfterSeconds;
    this.freeBytes = details.freeBytes;
    this.share = details.share;
  }
}

/**
 * The store's backend cannot be used now (a bucket that cannot be reached, refuses our credentials or
 * does not exist): requests that need it get a retryable 503 and /ready says why. The message names
 * what failed and why, never a credential.
 */
export class StoreUnavailableError extends Error {
  /** The backend's short reason (NoSuchBucket, AccessDenied, ECONNREFUSED), fit to tell clients. */
  readonly reason: string;
  constructor(message: string, options: { cause?: unknown; reason: string }) {
    super(message, { cause: options.cause });
    this.name = 'StoreUnavailableError';
    this.reason = options.reason;
  }
}

/**
 * An image whose stored bytes are not those it was stored with (its file cut short, or changed, while
 * the server was stopped or by something else): it is gone, and never served in part as if whole.
 */
export class ImageDamagedError extends Error {
  constructor(readonly id: string) {
    super(`the image ${id} was damaged where it is stored`);
    this.name = 'ImageDamagedError';
  }
}

/**
 * Space set aside before images are generated, so that a full store refuses a request before any work
 * is spent on it. Puts made with it draw on it first; release() returns what they did not use.
 */
export interface StoreReservation {
  /** Bytes still set aside. */
  readonly bytes: number;
  /** Whose images the puts made with it are (StoredImage.owner), counted against that key's share. */
  readonly owner: string | undefined;
  release(): void;
}

/** Bytes `start` to `end` of a file, both included (as HTTP ranges count them), within its size. */
export interface ByteRange {
  start: number;
  end: number;
}

export interface ImageStore {
  /**
   * The origin of the addresses the store hands out itself (StoredImage.url: S3 presigned URLs), where
   * it does: a page showing its images must allow loading from it (the playground's policy).
   */
  readonly urlOrigin: string | undefined;
  /**
   * Sets `bytes` aside for images to come, of `owner` (an API key's imageOwner; none on a server without
   * keys); throws StoreFullError when they do not fit, or would take the owner past its share, even after a sweep.
   */
  reserve(bytes: number, owner?: string): Promise<StoreReservation>;
  /**
   * Stores an image until its expiry, drawing on `reservation` first (the image is the reservation's
   * owner's); throws StoreFullError when it does not fit even after a sweep.
   */
  put(data: Uint8Array, contentType: string, reservation?: StoreReservation): Promise<StoredImage>;
  /** The image, or null when unknown or expired (even before a sweep deleted it); throws ImageDamagedError for one found damaged. */
  get(id: string): Promise<StoredImage | null>;
  /** The image's bytes (those of `range` only, when given) as a stream, or null if it expired or vanished meanwhile; throws ImageDamagedError when its stored bytes are not those it was stored with. */
  read(image: StoredImage, range?: ByteRange): Promise<Readable | null>;
  /** Whether read() would find the image now, without reading it (a HEAD). */
  has(image: StoredImage): Promise<boolean>;
  /** Deletes images before they expire: ones no response will name after all. */
  remove(images: StoredImage[]): Promise<void>;
  /** Deletes expired images. */
  sweep(): Promise<void>;
  /** Throws StoreUnavailableError when the store cannot take or serve images now (for /ready). */
  check(): Promise<void>;
  /** Images and bytes held, for metrics. */
  stats(): { files: number; bytes: number };
  /** The store's clock, unix milliseconds: expiry is measured on it. */
  now(): number;
  close(): Promise<void>;
}

/** What every store is opened with, whichever kind: how long images live, how much they may take, where it logs. */
export interface StoreLimits {
  ttlSeconds: number;
  maxBytes: number;
  logger: Logger;
  /** The clock expiry is measured on (unix milliseconds); Date.now unless a test passes its own. */
  clock?: () => number;
}
