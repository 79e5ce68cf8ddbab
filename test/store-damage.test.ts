import { mkdtemp, open as openFile, readdir, rm, truncate, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { FileImageStore } from '../src/store/file-store.js';
import { MIN_IMAGE_BYTES } from '../src/store/space.js';
import { ImageDamagedError } from '../src/store/image-store.js';
import { startTestServer } from './helpers/api-server.js';
import { capturedLogs, silentLogger } from './helpers/logs.js';
import type { ErrorBody } from '../src/api/wire.js';

/**
 * Image files damaged while the server was stopped (a restore that broke off, a truncation by
 * something else): after a restart they are answered as gone, never served as whole when they are not.
 */

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-store-damage-'));
});
afterEach(() => rm(dir, { recursive: true, force: true }));

/** The one image file of `folder`. */
async function imageFile(folder: string): Promise<string> {
  const names = (await readdir(folder)).filter((name) => !name.startsWith('.'));
  expect(names).toHaveLength(1);
  return path.join(folder, names[0]);
}

/** Overwrites one byte in the middle of a file, keeping its length (a bad block, a restore's hole). */
async function flipByte(file: string): Promise<void> {
  const handle = await openFile(file, 'r+');
  try {
    const { size } = await handle.stat();
    const at = Math.floor(size / 2);
    const byte = Buffer.alloc(1);
    await handle.read(byte, 0, 1, at);
    await handle.write(Buffer.from([byte[0] ^ 0xff]), 0, 1, at);
  } finally {
    await handle.close();
  }
}

describe('images damaged while the server was stopped', () => {
  for (const [damage, harm] of [
    ['cut short', (file: string) => truncate(file, 10)],
    ['changed in place (same length)', flipByte],
  ] as const) {
    it(`answers an image whose file was ${damage} as gone (404 in OpenAI shape), not as a whole image`, async () => {
      const dataDir = path.join(dir, 'data');
      const before = await startTestServer({ dataDir });
      const { data } = await before.client.images.generate({ model: 'stub', prompt: 'x' });
      const name = data![0].url!.split('/').pop()!;
      await before.close();
      await harm(await imageFile(dataDir));

      const after = await startTestServer({ dataDir });
      try {
        for (const method of ['HEAD', 'GET', 'GET']) {
          const res = await fetch(`${after.baseURL}/images/files/${name}`, { method });
          expect([method, res.status]).toEqual([method, 404]);
          if (method === 'HEAD') continue;
          const { error } = (await res.json()) as ErrorBody;
          expect(error).toMatchObject({ type: 'invalid_request_error', param: null, code: 'image_not_found' });
          expect(error.message).toMatch(/damaged/);
        }
      } finally {
        await after.close();
      }
    });
  }

  it('logs a warning naming the damaged image once it is found, counts its bytes no more, and deletes its file when it expires', async () => {
    let now = Date.UTC(2026, 10, 23);
    const clock = () => now;
    const first = await FileImageStore.open({ dir, ttlSeconds: 60, maxBytes: 1e6, logger: silentLogger, clock });
    const image = await first.put(new Uint8Array(100).fill(3), 'image/png');
    const kept = await first.put(new Uint8Array(50).fill(4), 'image/png');
    await first.close();
    await truncate(path.join(dir, (await readdir(dir)).find((name) => name.startsWith(image.id))!), 40);

    const { logger, lines } = capturedLogs<{ level: number; id?: string; msg: string }>();
    const store = await FileImageStore.open({ dir, ttlSeconds: 60, maxBytes: 1e6, logger, clock });
    await expect(store.read((await store.get(image.id))!)).rejects.toThrow(/damaged/);
    expect(lines).toEqual([expect.objectContaining({ level: 40, id: image.id, msg: expect.stringMatching(/damaged/) })]);
    // Still damaged, not unknown, until it expires; then deleted with the expired images.
    await expect(store.get(image.id)).rejects.toBeInstanceOf(ImageDamagedError);
    // Its 50 bytes count a block (space.ts).
    expect(store.stats()).toEqual({ files: 1, bytes: MIN_IMAGE_BYTES });
    // The undamaged one is served whole.
    expect(Buffer.concat(await (await store.read((await store.get(kept.id))!))!.toArray())).toEqual(Buffer.alloc(50, 4));
    now += 61_000;
    expect(await store.get(image.id)).toBeNull();
    await store.sweep();
    expect(await readdir(dir)).toEqual([]);
  });

  it('checks a file of an earlier run once for the reads that come together: served whole to each, or its damage reported once', async () => {
    const first = await FileImageStore.open({ dir, ttlSeconds: 60, maxBytes: 1e7, logger: silentLogger });
    const whole = await first.put(new Uint8Array(1 << 20).fill(7), 'image/png');
    const harmed = await first.put(new Uint8Array(1 << 20).fill(8), 'image/png');
    await first.close();
    await flipByte(path.join(dir, (await readdir(dir)).find((name) => name.startsWith(harmed.id))!));

    const { logger, lines } = capturedLogs<{ level: number; id?: string; msg: string }>();
    const store = await FileImageStore.open({ dir, ttlSeconds: 60, maxBytes: 1e7, logger });
    const [wholeRecord, harmedRecord] = [(await store.get(whole.id))!, (await store.get(harmed.id))!];
    const bodies = await Promise.all(Array.from({ length: 8 }, async () => Buffer.concat(await (await store.read(wholeRecord))!.toArray())));
    for (const body of bodies) expect(body.equals(Buffer.alloc(1 << 20, 7))).toBe(true);
    const refusals = await Promise.allSettled(Array.from({ length: 8 }, () => store.read(harmedRecord)));
    expect(refusals.map((r) => (r.status === 'rejected' ? (r.reason as Error).name : 'served'))).toEqual(Array(8).fill('ImageDamagedError'));
    expect(lines).toEqual([expect.objectContaining({ level: 40, id: harmed.id, msg: expect.stringMatching(/damaged/) })]);
  });

  it('keeps serving files named before images carried their length (written by an older version), at their size on disk', async () => {
    const id = 'e'.repeat(32);
    const expiresAt = Date.now() + 60_000;
    await writeFile(path.join(dir, `${id}.${expiresAt}.png`), Buffer.alloc(30, 5));
    const store = await FileImageStore.open({ dir, ttlSeconds: 60, maxBytes: 1e6, logger: silentLogger });
    const image = await store.get(id);
    expect(image).toMatchObject({ id, expiresAt, size: 30, contentType: 'image/png' });
    expect(Buffer.concat(await (await store.read(image!))!.toArray())).toEqual(Buffer.alloc(30, 5));
  });
});
