import { clientShare, Holdings } from '../util/byte-budget.js';
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
  inOrder(): Iterable<{ size: number; expiresAt: number; owner?: string }>;
  now(): number;
}

/**
 * A store's byte limit: the bytes its images take (plus writes in progress) and the bytes reservations
 * set aside, against `maxBytes`. Both stores count the same way; each tells it the sizes of the images
 * it holds, and it alone counts each as spaceOf says (a store that counted an image at its length in one
 * place and at spaceOf in another would drift until its count meant nothing). Every count changes in
 * the same turn as the check that lets it in, so parallel reservations and puts cannot overfill
 * (counted a turn later, two that found room at once both took it).
 *
 * One API key (an image's owner) holds at most half of it, or the images of the request it makes where
 * those are more (a lone request always fits): one key's url requests filled the store, and every other
 * key's got 507 for as long as the images lived (IMAGE_TTL_SECONDS, a day by default). The share counts
 * the key's images wherever they were stored (their names carry the owner: image-names.ts), so a restart
 * or another replica counts them alike. Images of nobody (a server without keys, names from before
 * owners) count against the whole store only. The share of a request is its own images, not the largest
 * any request could make: the largest depends on the model and size asked for, and a key holding
 * nothing else may then take what any one request needs, as UPLOAD_MEMORY's share lets a lone body in.
 */
export class StoreSpace {
  /** Bytes of stored images plus writes in progress, each counted as spaceOf says. */
  private counted = 0;
  /** Bytes set aside by reservations and not yet written. */
  private reserved = 0;
  /** What `counted` and `reserved` hold of each owner (none: nothing). */
  private readonly countedOf = new Holdings();
  private readonly reservedOf = new Holdings();

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

  /** What `owner`'s images (and writes in progress) and reservations count now. */
  heldBy(owner: string): number {
    return this.countedOf.of(owner) + this.reservedOf.of(owner);
  }

  /** Sets `bytes` aside for images of `owner` to come; throws StoreFullError when it does not fit, or takes the owner past its share, even after a sweep. */
  async reserve(bytes: number, owner?: string): Promise<StoreReservation> {
    await this.makeRoom(bytes, owner, () => this.setAside(bytes, owner));
    return new SpaceReservation(bytes, owner, (unused) => this.setAside(-unused, owner));
  }

  /** Counts the write of an image of `size` bytes of the reservation's owner, drawing on `reservation` first; throws StoreFullError when the rest does not fit even after a sweep. */
  async claim(size: number, reservation?: StoreReservation): Promise<void> {
    const bytes = spaceOf(size);
    const owner = reservation?.owner;
    const covered = reservation instanceof SpaceReservation ? reservation.draw(bytes) : 0;
    // The covered part goes from the reservation to the write at once (nobody else may take it while the
    // rest waits for a sweep), and leaves it whatever happens next: a put that fails has no use for it.
    this.setAside(-covered, owner);
    this.count(covered, owner);
    // A put its reservation covers whole is let in whatever the count says now: the space was promised
    // before its images were made, and a recount since (an S3 listing that found other replicas' images)
    // must not turn the generation the client waited for into a 507.
    if (covered === bytes) return;
    try {
      await this.makeRoom(bytes - covered, owner, () => this.count(bytes - covered, owner));
    } catch (err) {
      this.count(-covered, owner);
      throw err;
    }
  }

  /** Counts an image of `size` bytes of `owner` that a listing found (another server's, a previous run's). */
  add(size: number, owner?: string): void {
    this.count(spaceOf(size), owner);
  }

  /** An image of `size` bytes of `owner` no longer held: deleted, or its write failed. */
  free(size: number, owner?: string): void {
    this.count(-spaceOf(size), owner);
  }

  /** Counts exactly these images (a listing's, puts it may have missed, writes in progress), and nothing else. */
  recount(...groups: Iterable<{ size: number; owner?: string }>[]): void {
    this.counted = 0;
    this.countedOf.clear();
    for (const images of groups) for (const { size, owner } of images) this.add(size, owner);
  }

  private count(bytes: number, owner: string | undefined): void {
    this.counted += bytes;
    this.countedOf.add(owner, bytes);
  }

  private setAside(bytes: number, owner: string | undefined): void {
    this.reserved += bytes;
    this.reservedOf.add(owner, bytes);
  }

  /**
   * Counts `bytes` of `owner` (`count`) once they fit, in the store and in the owner's share, after a
   * sweep if need be; throws StoreFullError when they do not.
   */
  private async makeRoom(bytes: number, owner: string | undefined, count: () => void): Promise<void> {
    if (bytes > this.maxBytes) throw new StoreFullError('too-large', { maxBytes: this.maxBytes, neededBytes: bytes });
    const share = clientShare(this.maxBytes, bytes);
    const fits = () => this.counted + this.reserved + bytes <= this.maxBytes && (owner === undefined || this.heldBy(owner) + bytes <= share);
    if (!fits()) await this.sweep();
    if (fits()) return void count();
    if (owner !== undefined && this.heldBy(owner) + bytes > share) {
      const over = this.countedOf.of(owner) + bytes - share;
      const running = over <= 0;
      const retryAfterSeconds = running ? undefined : this.secondsUntilFreed(over, owner);
      throw new StoreFullError('share', { maxBytes: this.maxBytes, neededBytes: bytes, retryAfterSeconds, share: { bytes: share, running } });
    }
    if (this.counted + bytes <= this.maxBytes) throw new StoreFullError('running', { maxBytes: this.maxBytes, neededBytes: bytes });
    throw new StoreFullError('images', { maxBytes: this.maxBytes, neededBytes: bytes, retryAfterSeconds: this.secondsUntilFreed(this.counted + bytes - this.maxBytes) });
  }

  /**
   * Seconds until enough of the stored images (of `owner` only, when given) expire to free `bytes`;
   * undefined when they never would, or the store does not know.
   */
  private secondsUntilFreed(bytes: number, owner?: string): number | undefined {
    if (!this.expiring) return undefined;
    let freed = 0;
    for (const image of this.expiring.inOrder()) {
      if (owner !== undefined && image.owner !== owner) continue;
      freed += spaceOf(image.size);
      if (freed >= bytes) return Math.max(1, Math.ceil((image.expiresAt - this.expiring.now()) / 1000));
    }
    return undefined;
  }
}

