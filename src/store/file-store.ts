import { open, statfs, unlink, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { isDiskFull, unlessMissing } from '../util/files.js';
import { ImageDamagedError, StoreFullError, StoreUnavailableError, type ByteRange, type ImageStore, type StoredImage, type StoreLimits, type StoreReservation } from './image-store.js';
import { digestOf, extensionOf, imageName, isExpired, newImage } from './image-names.js';
import { nameableOwner } from './image-owner.js';
import { StoreSpace } from './space.js';
import { codeOrMessage, messageOf } from '../util/error-message.js';
import { ExpiryOrder } from './expiry-order.js';
import { FolderListing, type ListedIndex } from './folder-listing.js';
import { deleteStaleTempFiles, tempFileOf, writeDurably } from './durable-write.js';
import { FolderHealth } from './folder-health.js';

/**
 * Generated images served by URL for a limited time. One file per image, named as image-names.ts says
 * (`<id>.<expiry unix milliseconds>.<size>.<digest>.<ext>`): a restart rebuilds the index from a
 * directory listing and keeps each image's own expiry. Files are written so that neither a reader nor a
 * restart after a power loss sees half an image, or loses one whose URL went out (durable-write.ts); the
 * sweeper deletes the temporary files a crash left. Ids are 128 random bits in hex.
 *
 * Each name records its image's size and digest: a restart indexes the folder from its names alone (no
 * file read, nor even stat'ed), and the first read of each image it found checks the file against them,
 * so that a file cut short or changed while no server ran (a restore that broke off) is answered as
 * damaged rather than served in part as if whole. Files named without the record (stored by a version
 * before it, until they expire) are taken at their size on disk, unchecked.
 *
 * Two servers may share the folder for a while (a restart that starts the new server before stopping
 * the old, blue-green on one host): an id this store has not indexed is looked for in a new listing of
 * the folder (folder-listing.ts), and so is every sweep, which then deletes the other's expired images
 * too; temporary files are deleted only once they are older than any write takes, so that neither
 * server loses the other's images.
 */

/**
 * The index's record of an image: all records of one object shape (made by a spread, each had a hidden
 * class of its own), their id and digest strings of their own (cut from a file name or from a hash's
 * 64 digits, each kept the whole string alive). About 250 bytes of heap an image where it took 600: the
 * index holds one per image, up to one per 4 KiB of MAX_STORE_BYTES (524288 for 2g).
 */
function indexRecord(image: StoredImage): StoredImage {
  const { id, ext, contentType, expiresAt, size, digest, owner } = image;
  return { id: ownCopy(id), ext, contentType, expiresAt, size, digest: digest === undefined ? undefined : ownCopy(digest), owner: owner === undefined ? undefined : ownCopy(owner) };
}

/** A hex string as a string of its own, rather than a slice that keeps the longer string it was cut from. */
const ownCopy = (hex: string): string => Buffer.from(hex, 'hex').toString('hex');

export interface ImageStoreOptions extends StoreLimits {
  /** Folder of the images (created if missing). */
  dir: string;
}

export class FileImageStore implements ImageStore {
  /** Its images are served by the server's files route. */
  readonly urlOrigin = undefined;
  private readonly index = new Map<string, StoredImage>();
  /** The indexed images by expiry, for a full store's Retry-After (see ExpiryOrder). */
  private readonly byExpiry = new ExpiryOrder<StoredImage>((image) => this.index.get(image.id) === image);
  /** Bytes of indexed files plus writes in progress, and reservations, against maxBytes. */
  private readonly space: StoreSpace;
  /** Writes in progress by image id: a listing meanwhile must not count their files a second time. */
  private readonly writes = new Map<string, Promise<void>>();
  /** Ids being deleted: out of the index, their files not gone yet; a listing meanwhile must not count them again. */
  private readonly deleting = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  /** Images whose files changed on disk after they were stored (see read): never indexed again, their files deleted when they expire. */
  private readonly damaged = new Map<string, StoredImage>();
  /** Ids indexed from a listing whose files have not been checked against their digests yet (see read). */
  private readonly unchecked = new Set<string>();
  /** The digest checks running, by id: a read that comes meanwhile waits for the one (see damageOf). */
  private readonly checking = new Map<string, Promise<string | undefined>>();
  /** Indexes the images of a previous run, and of another server sharing the folder. */
  private readonly listing: FolderListing;
  readonly now: () => number;
  private constructor(
    private readonly options: ImageStoreOptions,
    /** Whether the folder can take images now, for check(). */
    private readonly folder: FolderHealth,
  ) {
    this.now = options.clock ?? Date.now;
    // Making room deletes expired images only: listing the folder and deleting a crash's temporary files are the sweeper's.
    this.space = new StoreSpace(options.maxBytes, () => this.deleteExpired(), { inOrder: () => this.byExpiry.inOrder(), now: this.now });
    const index: ListedIndex = { images: this.index, knows: (id) => this.knows(id), found: (image) => this.indexFound(image), lost: (image) => this.forget(image) };
    this.listing = new FolderListing(options.dir, index, options.logger);
  }

  /** Opens the store: indexes the images left by a previous run, and deletes expired ones (in the background) and half-written ones. */
  static async open(options: ImageStoreOptions): Promise<FileImageStore> {
    const store = new FileImageStore(options, await FolderHealth.open(options.dir, options.logger));
    await store.listing.listIfChanged().catch(() => undefined);
    // Out of the index (and the byte count) at once, their files deleted while the server serves: awaited,
    // a folder whose images had all expired while the server was stopped (500000 after a day) kept it from
    // listening for a minute, one unlink at a time, with nothing in its log. A shutdown meanwhile leaves the
    // rest to the next start's listing.
    void store.deleteExpired().catch((err: unknown) => store.cannotSweep(err));
    await deleteStaleTempFiles(options.dir);
    // A folder it can list but not write (a disk remounted read-only, one another user owns) does not
    // stop the start: the images it holds are still served. Said now, as a failing bucket is: it started
    // saying "worker ready", and first said why every url request failed when one came or /ready was asked.
    await store.check().catch((err: unknown) => options.logger.error({ err }, `image store: ${messageOf(err)}; until it can, url requests get 503 storage_unavailable and /ready answers 503`));
    return store;
  }

  /** Whether a listing is to leave the id's file be (ListedIndex.knows): indexed, being written or deleted, or found damaged. */
  private knows(id: string): boolean {
    return this.index.has(id) || this.writes.has(id) || this.deleting.has(id) || this.damaged.has(id);
  }

  private fileOf(image: StoredImage): string {
    return path.join(this.options.dir, imageName(image));
  }

  /**
   * Sets space aside for images to come; throws StoreFullError when it does not fit even after deleting
   * expired ones, and StoreUnavailableError when the folder cannot be written (before any work is done
   * for images that could not be kept).
   */
  async reserve(bytes: number, owner?: string): Promise<StoreReservation> {
    await this.check();
    const disk = await statfs(this.options.dir).catch((err: NodeJS.ErrnoException) => {
      throw new StoreUnavailableError(`the image folder ${this.options.dir} cannot be examined (${codeOrMessage(err)})`, { cause: err, reason: err.code ?? 'statfs failed' });
    });
    const free = disk.bavail * disk.bsize;
    if (free < bytes) throw new StoreFullError('disk', { maxBytes: this.options.maxBytes, neededBytes: bytes, freeBytes: free });
    return this.space.reserve(bytes, nameableOwner(owner));
  }

  /** Stores an image of the reservation's owner, drawing on `reservation` first; throws StoreFullError when the rest does not fit even after deleting expired ones. */
  async put(data: Uint8Array, contentType: string, reservation?: StoreReservation): Promise<StoredImage> {
    const ext = extensionOf(contentType);
    await this.space.claim(data.byteLength, reservation);

    const image = indexRecord({ ...newImage(ext, contentType, data.byteLength, this.now(), this.options.ttlSeconds, reservation?.owner), digest: await digestOf([data]) });
    const write = writeDurably(tempFileOf(this.options.dir, image.id), this.fileOf(image), data);
    this.writes.set(image.id, write);
    try {
      await write;
    } catch (err) {
      this.space.free(data.byteLength, image.owner);
      throw await this.whyWriteFailed(err, data.byteLength);
    } finally {
      this.writes.delete(image.id);
    }
    this.indexImage(image);
    return image;
  }

  /**
   * What a failed write of `bytes` is to the request: a full disk is the StoreFullError a reservation
   * finding it full gets; the folder gone read-only, deleted or replaced since reserve() checked it is the
   * 503 (StoreUnavailableError) a request after it gets, not a 500 for one that was generating meanwhile;
   * a deleted folder is made again by check(), so a retry keeps its images. Any other error (EIO, EFBIG)
   * stays what it is.
   */
  private async whyWriteFailed(err: unknown, bytes: number): Promise<unknown> {
    if (isDiskFull(err)) return new StoreFullError('disk', { maxBytes: this.options.maxBytes, neededBytes: bytes });
    const { code } = err as NodeJS.ErrnoException;
    try {
      await this.check();
    } catch (unusable) {
      return unusable;
    }
    if (code !== 'ENOENT') return err;
    return new StoreUnavailableError(`the image folder ${this.options.dir} was deleted while an image was written to it (made again)`, { cause: err, reason: code });
  }

  /** Images and the bytes they count against the limit (including writes in progress; see spaceOf), for metrics. */
  stats(): { files: number; bytes: number } {
    return { files: this.index.size, bytes: this.space.used };
  }

  /** The image, or null when unknown or expired (even before the sweeper deleted it); throws ImageDamagedError for one found damaged. */
  async get(id: string): Promise<StoredImage | null> {
    const damaged = this.damaged.get(id);
    if (damaged && !isExpired(damaged, this.now())) throw new ImageDamagedError(id);
    if (!this.index.has(id)) await this.listing.listIfChanged().catch(() => undefined);
    const image = this.index.get(id);
    return image && !isExpired(image, this.now()) ? image : null;
  }

  /** The image's bytes as a stream, or null if it expired or vanished meanwhile; throws ImageDamagedError when its file is not as it was stored. */
  async read(image: StoredImage, range?: ByteRange): Promise<Readable | null> {
    if (isExpired(image, this.now())) return null;
    // Opened here, so that a file the sweeper just deleted is a null rather than a stream that fails.
    const handle = await unlessMissing(open(this.fileOf(image))).catch((err: unknown) => this.unreadable(err));
    if (!handle) {
      // Deleted by something else than the sweeper: its space is free, and HEAD no longer finds it either.
      if (!isExpired(image, this.now())) this.forget(image);
      return null;
    }
    // Changed on disk since it was stored (truncated by something else): served, it would break off
    // short of its Content-Length, or be whole in length only; it is forgotten (left on disk to look at
    // until it expires) and answered as damaged.
    const damage = await this.damageOf(image, handle).catch(async (err: unknown) => {
      await handle.close();
      return this.unreadable(err);
    });
    if (damage) {
      await handle.close();
      // Reads that shared the check (see damageOf) hear of the damage together: the first reports it.
      if (this.index.get(image.id) === image) {
        this.options.logger.warn({ id: image.id, file: this.fileOf(image) }, `image file damaged on disk since it was stored (${damage}): no longer served`);
        this.forget(image);
        this.damaged.set(image.id, image);
      }
      throw new ImageDamagedError(image.id);
    }
    // Its end given, the stream ends with its last byte rather than after one more read finds the end of
    // the file: a client that closes as soon as it has every byte would otherwise close before the
    // answer ends, and be counted and logged as one that left early (499).
    return handle.createReadStream(range ?? (image.size > 0 ? { start: 0, end: image.size - 1 } : {}));
  }

  /**
   * A file that is there but cannot be read now (its folder replaced by a file, made unreadable, a failing
   * disk): the store is what fails, a retryable 503 as for a bucket that does not answer, not a 500 nor a
   * 404 that says the image is gone.
   */
  private unreadable(err: unknown): never {
    const { code } = err as NodeJS.ErrnoException;
    throw new StoreUnavailableError(`the image folder ${this.options.dir} cannot be read (${codeOrMessage(err)})`, { cause: err, reason: code ?? 'unreadable' });
  }

  /**
   * What is wrong with the image's open file, or undefined when it is as it was stored: its size, always
   * (a stat); its digest, once, for an image indexed from a listing (a file of a previous run, or another
   * server's), whose bytes are read through once more for it. Reads that come while it is checked wait
   * for that check: a page of images opened by many clients right after a restart read each file once
   * per client (150 reads of a 12 MB image took 8 s against 3.3 s once checked).
   */
  private async damageOf(image: StoredImage, handle: FileHandle): Promise<string | undefined> {
    const { size } = await handle.stat();
    if (size !== image.size) return `${size} bytes, not ${image.size}`;
    if (!this.unchecked.has(image.id)) return undefined;
    let check = this.checking.get(image.id);
    if (!check) {
      // Not closed at its end: the handle serves the image next.
      check = digestOf(handle.createReadStream({ start: 0, autoClose: false }))
        .then((digest) => (digest === image.digest ? undefined : `its bytes' digest is ${digest}, not ${image.digest ?? 'recorded'}`))
        .finally(() => this.checking.delete(image.id));
      this.checking.set(image.id, check);
    }
    const damage = await check;
    if (!damage) this.unchecked.delete(image.id);
    return damage;
  }

  /** Whether the image's file is still there as it was stored (a HEAD answers what a GET would); throws ImageDamagedError when it is not. */
  async has(image: StoredImage): Promise<boolean> {
    const data = await this.read(image);
    data?.destroy();
    return data !== null;
  }

  /** Adds an image to the index (its bytes are counted by the caller). */
  private indexImage(image: StoredImage): void {
    this.index.set(image.id, image);
    this.byExpiry.add(image);
  }

  /** Adds an image a listing found (a previous run's, another server's), its bytes counted; one named with a digest is checked against it when first read. */
  private indexFound(found: StoredImage): void {
    const image = indexRecord(found);
    if (image.digest !== undefined) this.unchecked.add(image.id);
    this.indexImage(image);
    this.space.add(image.size, image.owner);
  }

  /** Drops an image from the index (and its bytes from the count) without touching its file. */
  private forget(image: StoredImage): void {
    if (this.index.get(image.id) !== image) return;
    this.index.delete(image.id);
    this.byExpiry.noteRemoved();
    this.unchecked.delete(image.id);
    this.space.free(image.size, image.owner);
  }

  /** Throws StoreUnavailableError when the folder cannot be written (see FolderHealth). */
  check(): Promise<void> {
    return this.folder.check();
  }

  /**
   * Deletes expired images, those of another server sharing the folder (listed again when it changed)
   * included, and temporary files a crash left.
   */
  async sweep(): Promise<void> {
    await this.listing.listIfChanged().catch(() => undefined);
    await this.deleteExpired();
    await deleteStaleTempFiles(this.options.dir);
  }

  /**
   * Deletes the images that expired, damaged ones too: what a put or reservation that finds the store full
   * can free. Read in the order they expire, as far as the first that has not: each refusal of a full
   * store runs this, and reading the whole index held the server's thread some 25 ms per 507 at 524,288 images.
   */
  private async deleteExpired(): Promise<void> {
    const now = this.now();
    const expired: StoredImage[] = [];
    for (const image of this.byExpiry.inOrder()) {
      if (!isExpired(image, now)) break;
      expired.push(image);
    }
    for (const image of this.damaged.values()) if (isExpired(image, now)) expired.push(image);
    for (const image of expired) this.damaged.delete(image.id);
    await this.discard(expired);
    if (expired.length) this.options.logger.debug({ deleted: expired.length }, 'expired images deleted');
  }

  /** Deletes images before they expire: ones no response will name after all. */
  async remove(images: StoredImage[]): Promise<void> {
    await this.discard(images.filter((image) => this.index.get(image.id) === image));
  }

  private async discard(images: StoredImage[]): Promise<void> {
    // Out of the index before the first await, so that sweeps running at the same time (one per put
    // that finds the store full) never count the same image twice.
    for (const image of images) {
      this.forget(image);
      this.deleting.add(image.id);
    }
    for (const image of images) {
      await unlink(this.fileOf(image)).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== 'ENOENT') this.options.logger.warn({ err, id: image.id }, 'cannot delete image');
      });
      this.deleting.delete(image.id);
    }
  }

  /**
   * Sweeps every `intervalMs` until close(). A folder that cannot be listed now (replaced by a file, its
   * permissions changed, a failing disk) is logged and swept again next time: the sweep's rejection,
   * unhandled, ended the server, and every image it served with it (/ready says why the store fails).
   */
  startSweeper(intervalMs: number): void {
    this.timer = setInterval(() => void this.sweep().catch((err: unknown) => this.cannotSweep(err)), intervalMs);
    this.timer.unref();
  }

  private cannotSweep(err: unknown): void {
    this.options.logger.warn({ err, dir: this.options.dir }, `cannot sweep the image folder (${codeOrMessage(err)}): expired images and stale temporary files stay until it can be listed again`);
  }

  /** Stops the sweeper, lets writes in progress end, and deletes temporary files a crash may have left (a folder that cannot be listed is logged: the shutdown goes on). */
  async close(): Promise<void> {
    clearInterval(this.timer);
    await Promise.allSettled(this.writes.values());
    await deleteStaleTempFiles(this.options.dir).catch((err: unknown) => this.cannotSweep(err));
  }
}
