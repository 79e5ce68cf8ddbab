import { opendir, stat } from 'node:fs/promises';
import path from 'node:path';
import { setImmediate, setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import { unlessMissing } from '../util/files.js';
import { IMAGE_ID, type StoredImage } from './image-store.js';
import { parseImageName } from './image-names.js';

/**
 * Brings the file store's index up to date with its folder, which another server may share for a while
 * (a restart that starts the new server before stopping the old, blue-green on one host): a listing
 * indexes the images the store does not know yet (a previous run's, the other server's) from their names
 * alone, and drops those whose files are gone. It lists only when a file came or went since the last
 * listing (the folder's mtime changed), and at most a tenth of the time (LISTING_PAUSE_FACTOR), so that
 * a scanner's random ids cost a stat each rather than a listing each.
 */

/**
 * After a listing, the next waits this many times as long as it took. A lookup of an id not indexed
 * lists the folder if it changed, which a busy server's folder always has (each put renames into it):
 * a flood of unknown ids (a scanner's, needing no key) listed it back to back, each listing as long as
 * the images are many (half a second for 100000), and the server did little else (one client's images
 * stored went from 1044 to 137 in 15 s, /health's p99 from 26 to 633 ms). Now listings take at most a
 * tenth of the time. A lookup waits for the next one, and so still finds another server's image; the
 * price is that a miss (an unknown or long-expired id) on a busy server waits up to ten listings'
 * time for its 404 (5 s with 100000 images), where it waited for one.
 */
const LISTING_PAUSE_FACTOR = 10;

/**
 * Folder entries a listing reads at a time. Read whole (readdir), the folder's names came in one piece
 * and were indexed in one turn of the server's thread: 1.4 to 2.9 s with 500000 images (0.2 to 0.35 s
 * with 50000), in every sweep of a busy server's folder and every listing for an unknown id, during
 * which no request, /health included, was answered. Each batch is a trip to libuv's thread pool, between
 * which the server answers others; the listing takes no longer in all.
 */
const LISTING_BATCH = 1024;

/**
 * A name that starts as an image's (its id) but is no name this version gives: an image a newer version
 * stored, named with more (or other) than this one reads, found after a rollback, or beside a newer
 * server sharing the folder during an upgrade.
 */
const LIKE_AN_IMAGE = new RegExp(`^${IMAGE_ID}\\.`);

/** The coarsest tick of a file system's clock (FAT's): within it of a change, a folder's mtime may not change again. */
const MTIME_TICK_MS = 2000;

/** What a listing needs of the store whose index it keeps up to date. */
export interface ListedIndex {
  /** The images indexed now, by id. */
  readonly images: ReadonlyMap<string, StoredImage>;
  /** Whether the store has the id's file in hand already (indexed, being written or deleted) or refuses it (found damaged): the listing leaves it be. */
  knows(id: string): boolean;
  /** Indexes and counts an image the listing found, at the size its name records (or, named without, its file has). */
  found(image: StoredImage): void;
  /** Drops an image whose file is gone from the folder (deleted by something else): its space is free again. One the store let go meanwhile is left be. */
  lost(image: StoredImage): void;
}

export class FolderListing {
  /** The folder's mtime when it was last listed, and the listing under way. */
  private listedMtime = NaN;
  private listing: Promise<void> | undefined;
  /** When the next listing may start, on the monotonic clock (see LISTING_PAUSE_FACTOR). */
  private nextListingAt = -Infinity;
  /** Whether the log has said that the folder holds images this version cannot read (see LIKE_AN_IMAGE): once, not at every listing. */
  private saidUnreadable = false;

  constructor(
    private readonly dir: string,
    private readonly index: ListedIndex,
    private readonly logger: Logger,
  ) {}

  /**
   * Indexes the folder's images not indexed yet (a previous run's, another server's) if a file came or
   * went since the last listing, once the pause after that listing is over (see LISTING_PAUSE_FACTOR).
   */
  async listIfChanged(): Promise<void> {
    while (this.listing) await this.listing;
    const folder = await unlessMissing(stat(this.dir));
    if (!folder || folder.mtimeMs === this.listedMtime || this.listing) return;
    this.listing = this.listAfterPause().finally(() => (this.listing = undefined));
    await this.listing;
  }

  private async listAfterPause(): Promise<void> {
    const pause = this.nextListingAt - performance.now();
    if (pause > 0) await sleep(pause);
    // Read before the listing: a file that comes during it changes the mtime again, unless it comes in
    // the same tick of the file system's clock (a second on ext3, HFS+ and ext4 of 128-byte inodes, two
    // on FAT). An mtime that recent is not trusted: the next lookup lists again. Trusted, another server's
    // image stored in that second was a 404 here until something else changed the folder.
    const folder = await unlessMissing(stat(this.dir));
    if (!folder) return;
    const mtime = Date.now() - folder.mtimeMs < MTIME_TICK_MS ? NaN : folder.mtimeMs;
    const started = performance.now();
    await this.list();
    // Only once listed: a listing that failed (EMFILE, a file it could not stat) is tried again by the
    // next lookup, where recorded first, nothing was listed again until a file came or went, and another
    // server's images stayed 404 meanwhile.
    this.listedMtime = mtime;
    const ms = performance.now() - started;
    this.nextListingAt = performance.now() + LISTING_PAUSE_FACTOR * ms;
    this.logger.debug({ files: this.index.images.size, ms }, 'image folder listed');
  }

  private async list(): Promise<void> {
    // Indexed before the folder is read: an image whose put ends meanwhile was renamed after, and may be missing from it.
    const indexed = [...this.index.images.values()];
    const listed = new Set<string>();
    let unreadable = 0;
    for await (const entry of await opendir(this.dir, { bufferSize: LISTING_BATCH })) {
      const named = entry.isFile() ? parseImageName(entry.name) : undefined;
      if (named) listed.add(named.id);
      else if (entry.isFile() && LIKE_AN_IMAGE.test(entry.name)) unreadable++;
      if (!named || this.index.knows(named.id)) continue;
      // The size its name records, checked against the file when it is first read: a restart over many
      // images lists the folder and reads nothing else. Named without (an older version's), its size on
      // disk; gone meanwhile (the other server's sweeper), skipped.
      const size = named.size ?? (await unlessMissing(stat(path.join(this.dir, entry.name))))?.size;
      if (size === undefined || this.index.knows(named.id)) continue;
      this.index.found({ ...named, size });
    }
    // Skipped unsaid, their URLs answered 404 as if they had expired, and their bytes went uncounted.
    if (unreadable > 0 && !this.saidUnreadable) {
      this.saidUnreadable = true;
      this.logger.warn(
        { dir: this.dir, files: unreadable },
        `${unreadable} files in the image folder are named as images but not as this version names them (a newer version's, after a rollback or beside a newer server sharing the folder): their URLs answer 404 here, and they are neither counted against MAX_STORE_BYTES nor deleted when they expire; the version that stored them serves and sweeps them`,
      );
    }
    // Deleted by something else (an operator freeing the disk, another server): their space is free again.
    // Counted until they would have expired, they kept a store they had filled refusing images for a day.
    // In batches too: one pass over 500000 took 0.2 s of the thread (lost() skips an image the store let go meanwhile).
    for (let start = 0; start < indexed.length; start += LISTING_BATCH) {
      if (start > 0) await setImmediate();
      for (const image of indexed.slice(start, start + LISTING_BATCH)) if (!listed.has(image.id)) this.index.lost(image);
    }
  }
}
