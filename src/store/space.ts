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

/** Images in the order they expire, and the clock they expire by: what a full store's Retry-After is worked out from. */
export interface ExpiringImages {
  /** The stored images, earliest expiry first, read for as long as the caller takes them. */
  inOrder(): Iterable<{ size: number; expiresAt: number }>;
  now(): number;
}

/**
 * A store's byte limit: the bytes its images take (plus writes in progress) and the bytes reservations
 * set aside, against `maxBytes`. Both stores count the same way; each tells it the sizes of the images
 * it holds, and it alone counts each as spaceOf says (a store that counted an image at its length in one
 * place and at spaceOf in another would drift until its count meant nothing). Every count changes in
 * the same turn as the check that lets it in, so parallel reservations and puts cannot overfill
 * (counted a turn later, two that found room at once both took it).
 */
export class StoreSpace {
  /** Bytes of stored images plus writes in progress, each counted as spaceOf says. */
  private counted = 0;
  /** Bytes set aside by reservations and not yet written. */
  private reserved = 0;

  constructor(
    readonly maxBytes: number,
    /** Frees what it can (deletes expired images) when something does not fit. */
    private readonly sweep: () => Promise<void>,
    /** The store's images by expiry, where it knows them: a full store then says when enough will have expired. */
    private readonly expiring?: ExpiringImages,
  ) {}

  /** Bytes the store's images (and writes in progress) count against the limit. */
  get used(): number {
    return this.counted;
  }

  /** Sets `bytes` aside for images to come; throws StoreFullError when it does not fit even after a sweep. */
  async reserve(bytes: number): Promise<StoreReservation> {
    await this.makeRoom(bytes, () => (this.reserved += bytes));
    return new SpaceReservation(bytes, (unused) => (this.reserved -= unused));
  }

  /** Counts the write of an image of `size` bytes, drawing on `reservation` first; throws StoreFullError when the rest does not fit even after a sweep. */
  async claim(size: number, reservation?: StoreReservation): Promise<void> {
    const bytes = spaceOf(size);
    const covered = reservation instanceof SpaceReservation ? reservation.draw(bytes) : 0;
    // The covered part goes from the reservation to the write at once (nobody else may take it while the
    // rest waits for a sweep), and leaves it whatever happens next: a put that fails has no use for it.
    this.reserved -= covered;
    this.counted += covered;
    // A put its reservation covers whole is let in whatever the count says now: the space was promised
    // before its images were made, and a recount since (an S3 listing that found other replicas' images)
    // must not turn the generation the client waited for into a 507.
    if (covered === bytes) return;
    try {
      await this.makeRoom(bytes - covered, () => (this.counted += bytes - covered));
    } catch (err) {
      this.counted -= covered;
      throw err;
    }
  }

  /** Counts an image of `size` bytes that a listing found (another server's, a previous run's). */
  add(size: number): void {
    this.counted += spaceOf(size);
  }

  /** An image of `size` bytes no longer held: deleted, or its write failed. */
  free(size: number): void {
    this.counted -= spaceOf(size);
  }

  /** Counts exactly the images of these sizes (a listing's, puts it may have missed, writes in progress), and nothing else. */
  recount(...groups: Iterable<number>[]): void {
    let bytes = 0;
    for (const sizes of groups) for (const size of sizes) bytes += spaceOf(size);
    this.counted = bytes;
  }

  /** Counts `bytes` (`count`) once they fit, after a sweep if need be; throws StoreFullError when they do not. */
  private async makeRoom(bytes: number, count: () => void): Promise<void> {
    if (bytes > this.maxBytes) throw new StoreFullError('too-large', this.maxBytes, bytes);
    const fits = () => this.counted + this.reserved + bytes <= this.maxBytes;
    if (!fits()) await this.sweep();
    if (fits()) return void count();
    if (this.counted + bytes <= this.maxBytes) throw new StoreFullError('running', this.maxBytes, bytes);
    throw new StoreFullError('images', this.maxBytes, bytes, this.secondsUntilFreed(this.counted + bytes - this.maxBytes));
  }

  /** Seconds until enough of the stored images expire to free `bytes`; undefined when they never would, or the store does not know. */
  private secondsUntilFreed(bytes: number): number | undefined {
    if (!this.expiring) return undefined;
    let freed = 0;
    for (const image of this.expiring.inOrder()) {
      freed += spaceOf(image.size);
      if (freed >= bytes) return Math.max(1, Math.ceil((image.expiresAt - this.expiring.now()) / 1000));
    }
    return undefined;
  }
}
