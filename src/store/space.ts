import { StoreFullError, type StoreReservation } from './image-store.js';
import { SpaceReservation } from './reservation.js';

/** The least an image counts against the limit: one block of the common filesystems (ext4, XFS, btrfs, tmpfs), the least a file takes. */
export const MIN_IMAGE_BYTES = 4096;

/**
 * What an image of `size` bytes counts against MAX_STORE_BYTES, in either store: at least a block.
 * Counted at its length, a flat 256x256 webp (400 bytes) took ten times its share of the disk, and the
 * limit let so many in (5 million under the default 2g, a few hours of one client's requests) that the
 * file store's index (about 600 bytes of heap each) outgrew the server's heap, and each S3 sweep listed
 * and held them all. Now the limit bounds the count too: 2g holds at most 524288 images.
 */
export const spaceOf = (size: number): number => Math.max(size, MIN_IMAGE_BYTES);

/**
 * A store's byte limit: the bytes its images take (plus writes in progress) and the bytes reservations
 * set aside, against `maxBytes`. Both stores count the same way; each tells it what it holds. Every
 * count changes before the first await, so parallel reservations and puts cannot overfill.
 */
export class StoreSpace {
  /** Bytes of stored images plus writes in progress. */
  used = 0;
  /** Bytes set aside by reservations and not yet written. */
  private reserved = 0;

  constructor(
    readonly maxBytes: number,
    /** Frees what it can (deletes expired images) when something does not fit. */
    private readonly sweep: () => Promise<void>,
    /** Seconds until images expiring free `bytes`, where the store knows its images' expiry. */
    private readonly secondsUntilFreed?: (bytes: number) => number | undefined,
  ) {}

  /** Sets space aside for images to come; throws StoreFullError when it does not fit even after a sweep. */
  async reserve(bytes: number): Promise<StoreReservation> {
    await this.makeRoom(bytes);
    this.reserved += bytes;
    return new SpaceReservation(bytes, (unused) => (this.reserved -= unused));
  }

  /** Counts a write of `bytes`, drawing on `reservation` first; throws StoreFullError when the rest does not fit even after a sweep. */
  async claim(bytes: number, reservation?: StoreReservation): Promise<void> {
    const covered = reservation instanceof SpaceReservation ? reservation.draw(bytes) : 0;
    // The covered part leaves the reservation whatever happens next: a put that fails has no use for it.
    this.reserved -= covered;
    await this.makeRoom(bytes - covered);
    this.used += bytes;
  }

  /** Bytes no longer held: an image deleted, or a write that failed. */
  free(bytes: number): void {
    this.used -= bytes;
  }

  private async makeRoom(bytes: number): Promise<void> {
    if (bytes > this.maxBytes) throw new StoreFullError('too-large', this.maxBytes, bytes);
    const fits = () => this.used + this.reserved + bytes <= this.maxBytes;
    if (!fits()) await this.sweep();
    if (fits()) return;
    if (this.used + bytes <= this.maxBytes) throw new StoreFullError('running', this.maxBytes, bytes);
    throw new StoreFullError('images', this.maxBytes, bytes, this.secondsUntilFreed?.(this.used + bytes - this.maxBytes));
  }
}
