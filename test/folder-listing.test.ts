import { mkdtemp, rm, utimes, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { FolderListing, type ListedIndex } from '../src/store/folder-listing.js';
import { imageName } from '../src/store/image-names.js';
import type { StoredImage } from '../src/store/image-store.js';

/**
 * The listing that indexes the images another server (or an earlier run) put in a shared folder. The
 * index is the listing's own interface (ListedIndex), kept here in a map whose first find fails, as a
 * listing can fail midway (a file it cannot stat, EMFILE).
 */

let dir: string | undefined;
afterEach(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('a folder listing', () => {
  it('that failed is tried again at the next lookup, not only once a file comes or goes', async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-listing-'));
    const image = { id: 'a'.repeat(32), ext: 'png', expiresAt: Date.now() + 60_000, size: 3, digest: '0'.repeat(16) } as const;
    await writeFile(path.join(dir, imageName(image)), 'png');
    // An mtime older than a file system's clock tick, which the listing trusts (see MTIME_TICK_MS).
    const past = new Date(Date.now() - 60_000);
    await utimes(dir, past, past);

    const images = new Map<string, StoredImage>();
    let failures = 1;
    const index: ListedIndex = {
      images,
      knows: (id) => images.has(id),
      found: (found) => {
        if (failures-- > 0) throw new Error('EMFILE: too many open files');
        images.set(found.id, found);
      },
      lost: (lost) => void images.delete(lost.id),
    };
    const listing = new FolderListing(dir, index, pino({ level: 'silent' }));
    await expect(listing.listIfChanged()).rejects.toThrow('EMFILE');
    await listing.listIfChanged();
    expect([...images.keys()]).toEqual([image.id]);
  });
});
