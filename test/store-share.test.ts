import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import sharp from 'sharp';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { FileImageStore } from '../src/store/file-store.js';
import { imageName } from '../src/store/image-names.js';
import { imageOwner } from '../src/store/image-owner.js';
import { StoreFullError } from '../src/store/image-store.js';
import { spaceOf, StoreSpace } from '../src/store/space.js';
import { startTestServer } from './helpers/api-server.js';
import { silentLogger } from './helpers/logs.js';

/**
 * One API key holds at most half of MAX_STORE_BYTES (or one request's images, where those are more):
 * before, one key's url requests filled the store and every other key's got 507 storage_full until the
 * images expired (a day by default). The share holds across restarts and replicas, because each image's
 * owner is in its name.
 */

const ALICE = 'sk-alice-0123456789abcdef';
const BOB = 'sk-bob-0123456789abcdef';
const KEYS = `alice:${ALICE}\nbob:${BOB}\n`;
/** A 64x64 url request reserves about 13 KiB (13312 bytes) and stores one image counted as 4 KiB: half of this holds four of them at most. */
const MAX_STORE_BYTES = 60_000;

type ApiError = InstanceType<typeof OpenAI.APIError>;
const refusal = (promise: Promise<unknown>) => promise.then(() => undefined, (err: unknown) => err as ApiError);

describe("a key's share of the image store, over HTTP with two keys", () => {
  let dataDir: string;
  beforeEach(async () => {
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-share-'));
  });
  afterEach(async () => {
    await rm(dataDir, { recursive: true, force: true });
  });

  it("refuses one key past half the store with a 507 that says so, while the other key's url requests still fit, across a restart", async () => {
    const first = await startTestServer({ keysFile: KEYS, maxStoreBytes: MAX_STORE_BYTES, dataDir });
    const as = (key: string) => new OpenAI({ baseURL: first.baseURL, apiKey: key, maxRetries: 0 });
    const urlOf = (key: string) => as(key).images.generate({ model: 'stub', prompt: 'x', size: '64x64' as '1024x1024', response_format: 'url' });
    try {
      // Alice asks for url images until refused: the whole store held 13 of them, her share holds only what half does.
      let stored = 0;
      let refused: ApiError | undefined;
      while (!refused && stored < 20) {
        refused = await refusal(urlOf(ALICE));
        if (!refused) stored += 1;
      }
      expect(refused).toBeInstanceOf(OpenAI.APIError);
      expect({ status: refused!.status, code: refused!.code }).toEqual({ status: 507, code: 'storage_full' });
      expect(refused!.message).toMatch(/This API key's images take as much of the server's image store as one key may \(29\.3 KiB of MAX_STORE_BYTES, 58\.6 KiB.*Ask for response_format 'b64_json', or retry in \d+s, when enough of this key's older images will have expired/);
      expect(Number(refused!.headers?.get('retry-after'))).toBeGreaterThan(3000);
      expect(stored).toBeGreaterThan(0);
      expect(first.store.stats().bytes).toBeLessThanOrEqual(MAX_STORE_BYTES / 2);
      // Inline images need no store space.
      expect((await as(ALICE).images.generate({ model: 'stub', prompt: 'x', size: '64x64' as '1024x1024', response_format: 'b64_json' })).data).toHaveLength(1);

      // Bob's url request fits, and its image is served.
      const bobs = await urlOf(BOB);
      const fetched = await fetch(bobs.data![0].url!, { headers: { authorization: `Bearer ${BOB}` } });
      expect(fetched.status).toBe(200);
      expect((await sharp(Buffer.from(await fetched.arrayBuffer())).metadata()).width).toBe(64);
      // Neither key nor label is in a URL, nor in the names the images are kept under.
      const names = (await readdir(dataDir)).join(' ');
      for (const secret of [ALICE, BOB, 'alice', 'bob']) expect(`${names} ${bobs.data![0].url}`).not.toContain(secret);
    } finally {
      await first.close();
    }

    // A restart over the same folder counts Alice's images as hers from their names.
    const second = await startTestServer({ keysFile: KEYS, maxStoreBytes: MAX_STORE_BYTES, dataDir });
    const again = (key: string) =>
      new OpenAI({ baseURL: second.baseURL, apiKey: key, maxRetries: 0 }).images.generate({ model: 'stub', prompt: 'x', size: '64x64' as '1024x1024', response_format: 'url' });
    try {
      expect(await refusal(again(ALICE))).toMatchObject({ status: 507, code: 'storage_full', message: expect.stringMatching(/This API key's images take as much/) });
      expect((await again(BOB)).data![0].url).toMatch(/^http/);
    } finally {
      await second.close();
    }
  });
});

describe('StoreSpace shares', () => {
  const noSweep = async () => undefined;

  it('lets one owner hold half, or a lone request however large, and owners of nothing the whole store', async () => {
    const space = new StoreSpace(100_000, noSweep);
    const a = imageOwner(ALICE);
    const b = imageOwner(BOB);
    await space.reserve(40_000, a);
    const over = await space.reserve(20_000, a).catch((e: unknown) => e as StoreFullError);
    expect(over).toMatchObject({ reason: 'share', share: { bytes: 50_000, running: true } });
    // Another owner, and nobody (a server without keys), still fit.
    await space.reserve(30_000, b);
    await space.reserve(30_000);
    expect(space.heldBy(a)).toBe(40_000);

    // A lone request more than half the store fits an owner holding nothing; one holding anything, not.
    const big = new StoreSpace(100_000, noSweep);
    const lone = await big.reserve(70_000, a);
    expect(big.heldBy(a)).toBe(70_000);
    lone.release();
    big.add(5000, a);
    expect(await big.reserve(70_000, a).catch((e: unknown) => e)).toMatchObject({ reason: 'share', share: { bytes: 70_000, running: false } });
    big.free(5000, a);
    expect(big.heldBy(a)).toBe(0);
  });

  it('counts owners as a recount (an S3 listing) finds them, keeping reservations', async () => {
    const space = new StoreSpace(100_000, noSweep);
    const a = imageOwner(ALICE);
    await space.reserve(10_000, a);
    space.recount([{ size: 30_000, owner: a }, { size: 100 }], [{ size: 5000, owner: imageOwner(BOB) }]);
    expect(space.heldBy(a)).toBe(40_000);
    expect(space.heldBy(imageOwner(BOB))).toBe(5000);
    expect(space.used).toBe(30_000 + spaceOf(100) + 5000);
    expect(await space.reserve(15_000, a).catch((e: unknown) => e)).toMatchObject({ reason: 'share', share: { running: true } });
    expect(await space.reserve(25_000, a).catch((e: unknown) => e)).toMatchObject({ reason: 'share', share: { running: false } });
  });

  it("tells an owner past its share to retry when its own images will have expired, not another owner's", async () => {
    const now = 1_000_000;
    const a = imageOwner(ALICE);
    const b = imageOwner(BOB);
    // Bob's image expires first; only Alice's own expiring frees room in her share.
    const images = [
      { size: 20_000, expiresAt: now + 10_000, owner: b },
      { size: 45_000, expiresAt: now + 100_000, owner: a },
    ];
    const space = new StoreSpace(100_000, noSweep, { inOrder: () => images, now: () => now });
    for (const { size, owner } of images) space.add(size, owner);
    expect(await space.reserve(10_000, a).catch((e: unknown) => e)).toMatchObject({ reason: 'share', retryAfterSeconds: 100, share: { running: false } });
  });
});

describe('FileImageStore owners', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-owners-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  const open = (clock?: () => number) => FileImageStore.open({ dir, ttlSeconds: 3600, maxBytes: 40_000, logger: silentLogger, clock });
  const png = () => sharp({ create: { width: 8, height: 8, channels: 3, background: '#808080' } }).png().toBuffer();

  it("keeps each image's owner in its name, and a restart counts it against that owner; images of older names are served and nobody's", async () => {
    const a = imageOwner(ALICE);
    const data = await png();
    // An image stored by a version before owners: its name has none.
    const now = Date.now();
    const old = imageName({ id: 'f'.repeat(32), expiresAt: now + 3_600_000, ext: 'png', size: data.length, digest: undefined, owner: undefined });
    await writeFile(path.join(dir, old), data);

    const store = await open();
    try {
      const reservation = await store.reserve(12_000, a);
      const mine = await store.put(data, 'image/png', reservation);
      reservation.release();
      expect(mine.owner).toBe(a);
      expect(await readdir(dir)).toContain(imageName(mine));
      expect(imageName(mine)).toContain(`.k${a}.`);
    } finally {
      await store.close();
    }

    const reopened = await open();
    try {
      // 4096 of Alice's images, 12000 more would pass her share of 20000 only with 4096 of nobody's counted as hers.
      await reopened.reserve(15_000, a).then((r) => r.release());
      expect(await reopened.reserve(16_000, a).catch((e: unknown) => e)).toMatchObject({ reason: 'share' });
      expect(reopened.stats()).toEqual({ files: 2, bytes: 2 * 4096 });
      const older = await reopened.get('f'.repeat(32));
      expect(older?.owner).toBeUndefined();
      expect(await reopened.has(older!)).toBe(true);
    } finally {
      await reopened.close();
    }
  });

  it('refuses an owner no image name could carry before counting anything', async () => {
    const store = await open();
    try {
      await expect(store.reserve(1000, 'alice')).rejects.toThrow(/imageOwner id/);
      expect(store.stats().bytes).toBe(0);
    } finally {
      await store.close();
    }
  });
});
