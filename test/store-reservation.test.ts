import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { expectedStoreBytes } from '../src/service/store-space.js';
import { FileImageStore } from '../src/store/file-store.js';
import { MIN_IMAGE_BYTES, spaceOf, StoreSpace } from '../src/store/space.js';
import { StoreFullError } from '../src/store/image-store.js';
import { startTestServer, TEST_KEY } from './helpers/api-server.js';
import { FakeEngine } from './helpers/engines.js';
import { silentLogger } from './helpers/logs.js';
import type { ErrorBody } from '../src/api/wire.js';

/**
 * A url request reserves its images' store space before any is generated: a store without room answers
 * 507 storage_full at once instead of after the work, and the reservation is returned when the request
 * ends, whether its images took all of it or not.
 */

/** 512x512 PNGs are expected to take up to 3 bytes a pixel (about 769 KiB each); 64x64 ones about 13 KiB. */
const MAX_STORE_BYTES = 60_000;

describe('store space reserved before generation', () => {
  it('answers 507 storage_full without generating when the images cannot fit, and keeps serving requests that fit', async () => {
    const server = await startTestServer({ maxStoreBytes: MAX_STORE_BYTES });
    try {
      const err = await server.client.images.generate({ model: 'stub', prompt: 'x', size: '512x512' as '1024x1024', response_format: 'url' }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.APIError);
      const apiErr = err as InstanceType<typeof OpenAI.APIError>;
      expect({ status: apiErr.status, code: apiErr.code, type: apiErr.type }).toEqual({ status: 507, code: 'storage_full', type: 'server_error' });
      // A 512x512 PNG may take 769 KiB: more than the whole store, which waiting cannot change.
      expect(apiErr.message).toMatch(/more than the whole store holds \(MAX_STORE_BYTES, 58\.6 KiB\)\. Ask for response_format 'b64_json'/);
      expect(apiErr.headers?.get('x-should-retry')).toBe('false');
      expect(server.engine.batches).toHaveLength(0);

      // The same size inline needs no store space.
      const inline = await server.client.images.generate({ model: 'stub', prompt: 'x', size: '512x512' as '1024x1024', response_format: 'b64_json' });
      expect(inline.data).toHaveLength(1);

      // Each of these reserves about 13 KiB and stores far less (a 64x64 picture of the demo model is a
      // few KiB): five in a row fit only if every request hands back what it did not use. One seed: the
      // key's half of the store (29.3 KiB) holds four stored and a fifth's reservation only while each
      // picture counts one 4 KiB block, and a random seed's shapes took more now and then.
      for (let i = 0; i < 5; i++) {
        const small = await server.client.images.generate({ model: 'stub', prompt: 'x', size: '64x64' as '1024x1024', response_format: 'url', seed: 1 } as OpenAI.ImageGenerateParamsNonStreaming);
        expect(small.data![0].url).toMatch(/^http/);
      }
      expect(server.store.stats().files).toBe(5);
      expect(server.store.stats().bytes).toBe(5 * MIN_IMAGE_BYTES);
    } finally {
      await server.close();
    }
  });

  it('releases the reservation of a request the queue turned away', async () => {
    // One worker, no waiting room: while one request runs, the others get 429. A fake engine, to hold it running.
    const engine = new FakeEngine(1, 0);
    // Without keys: the whole store is its one client's (one key's share of it: store-share.test.ts).
    const server = await startTestServer({ maxStoreBytes: 70_000, engine, apiKeys: [] });
    const ask = (n: number) => server.client.images.generate({ model: 'stub', prompt: 'x', n, size: '64x64' as '1024x1024', response_format: 'url' });
    try {
      engine.hold();
      const running = ask(1); // reserves about 13 KiB
      await expect.poll(() => engine.load().running).toBe(1);
      // Each of these reserves about 53 KiB: the second would get 507 had the first kept its reservation.
      for (let i = 0; i < 2; i++) {
        const err = (await ask(4).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
        expect([err.status, err.code]).toEqual([429, 'rate_limit_exceeded']);
      }
      engine.release();
      expect((await running).data).toHaveLength(1);
    } finally {
      await server.close();
    }
  });
});

describe('a store full with the images of running requests', () => {
  it('answers 507 storage_full with Retry-After, to be retried, while space set aside for running requests is what is missing; not to be retried when the images could never fit', async () => {
    // Two workers: one request holds its reservation (about 26 KiB for two 64x64 PNGs) while others come.
    // A fake engine, to hold it running.
    const engine = new FakeEngine(2, 4);
    // Without keys: the whole store is its one client's (one key's share of it: store-share.test.ts).
    const server = await startTestServer({ maxStoreBytes: 30_000, engine, apiKeys: [] });
    const ask = (n: number) => server.client.images.generate({ model: 'stub', prompt: 'x', n, size: '64x64' as '1024x1024', response_format: 'url' });
    const refusal = async (n: number) => {
      const res = await fetch(`${server.baseURL}/images/generations`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_KEY}` },
        body: JSON.stringify({ model: 'stub', prompt: 'x', n, size: '64x64' }),
      });
      const body = (await res.json()) as ErrorBody;
      return { status: res.status, code: body.error.code, message: body.error.message, retryAfter: res.headers.get('retry-after'), shouldRetry: res.headers.get('x-should-retry') };
    };
    try {
      engine.hold();
      const running = ask(2);
      await expect.poll(() => engine.load().running).toBe(1);
      expect(await refusal(1)).toMatchObject({ status: 507, code: 'storage_full', retryAfter: '5', shouldRetry: null, message: expect.stringMatching(/requests running now.*retry in a few seconds/) });
      // Three images would not fit in an empty store: retrying cannot help.
      expect(await refusal(3)).toMatchObject({ status: 507, code: 'storage_full', retryAfter: null, shouldRetry: 'false', message: expect.stringMatching(/more than the whole store holds/) });
      engine.release();
      expect((await running).data).toHaveLength(2);
      // The running request stored far less than it set aside, and handed the rest back.
      expect((await ask(1)).data).toHaveLength(1);
      // Full of unexpired images (their lifetime is the test server's hour): not to be retried now, and
      // Retry-After says when enough of them will have expired.
      // (The three small images stored count a 4 KiB block each.)
      await server.store.put(new Uint8Array(15_000), 'image/png');
      const full = await refusal(1);
      expect(full).toMatchObject({ status: 507, code: 'storage_full', shouldRetry: 'false', message: expect.stringMatching(/store is full \(MAX_STORE_BYTES, 29\.3 KiB\).*retry in \d+s, when enough older images will have expired/) });
      expect(Number(full.retryAfter)).toBeGreaterThan(3500);
    } finally {
      await server.close();
    }
  });
});

describe('FileImageStore reservations', () => {
  it('count against the limit until used or released; a put beyond its reservation is checked against what is left', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-reserve-'));
    // Sizes of at least a block (4 KiB), which count as they are.
    const store = await FileImageStore.open({ dir, ttlSeconds: 60, maxBytes: 20_000, logger: silentLogger });
    try {
      const first = await store.reserve(12_000);
      await expect(store.reserve(12_000)).rejects.toBeInstanceOf(StoreFullError);
      // 6000 bytes drawn from the reservation, 6000 left in it.
      await store.put(new Uint8Array(6000), 'image/png', first);
      expect(first.bytes).toBe(6000);
      await expect(store.reserve(10_000)).rejects.toBeInstanceOf(StoreFullError);
      // 6000 covered by the reservation, 4000 more fit in what is free; a further 12000 would not.
      await store.put(new Uint8Array(10_000), 'image/png', first);
      await expect(store.put(new Uint8Array(12_000), 'image/png', first)).rejects.toBeInstanceOf(StoreFullError);
      first.release();
      expect(store.stats().bytes).toBe(16_000);
      const second = await store.reserve(4000);
      second.release();
      second.release();
      expect((await store.reserve(4000)).bytes).toBe(4000);
    } finally {
      await store.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('StoreSpace under requests that ask at once', () => {
  // Each request's reservation or put reached the limit's check and was counted a turn later, so two
  // that asked in the same turn, or resumed from the same sweep, both found the room and both took it.
  const settled = (asks: Promise<unknown>[]) => Promise.allSettled(asks).then((results) => results.map((r) => r.status));

  // Sizes of several disk blocks, which the space counts as they are (spaceOf).
  it('lets only as many reservations in as fit', async () => {
    const space = new StoreSpace(10_000, async () => undefined);
    expect(await settled([space.reserve(6000), space.reserve(6000)])).toEqual(['fulfilled', 'rejected']);
  });

  it('lets only as many in as fit once a sweep they all waited for freed the space', async () => {
    // 9000 bytes of images that a sweep under way deletes (expired): both find no room and wait for it.
    let sweep!: () => void;
    const swept = new Promise<void>((resolve) => (sweep = resolve)).then(() => space.free(9000));
    const space = new StoreSpace(10_000, () => swept);
    space.add(9000);
    setImmediate(sweep);
    expect(await settled([space.reserve(6000), space.claim(6000)])).toEqual(['fulfilled', 'rejected']);
    expect(space.used).toBe(0);
  });

  it('counts the part of a put its reservation covers while the rest is checked (a put larger than its reservation went over the limit by that part), and frees it when the put is refused', async () => {
    const space = new StoreSpace(10_000, async () => undefined);
    const reservation = await space.reserve(5000);
    // 5000 covered, 6000 more do not fit: refused; the reservation's 5000 went with it.
    const [put, other] = await settled([space.claim(11_000, reservation), space.reserve(5000)]);
    expect([put, other]).toEqual(['rejected', 'fulfilled']);
    expect(reservation.bytes).toBe(0);
    expect(space.used).toBe(0);
  });
});

describe('a put its reservation covers', () => {
  it('is let in even when a recount since found the store over its limit (the images were made on the promise)', async () => {
    const space = new StoreSpace(10_000, async () => undefined);
    const reservation = await space.reserve(5000);
    // Another replica's images, found by a listing after the reservation was made.
    space.add(8000);
    await expect(space.claim(5000, reservation)).resolves.toBeUndefined();
    expect(space.used).toBe(13_000);
    // A put without a reservation is still checked.
    await expect(space.claim(5000)).rejects.toMatchObject({ name: 'StoreFullError' });
  });
});

describe('expectedStoreBytes', () => {
  it('reserves at least what the store counts each image (a disk block), so a put of a tiny image never claims more than was reserved', () => {
    const item = { prompt: 'x', seed: 1, output: { format: 'jpeg' as const } };
    const tiny = { modelDir: '/m', width: 16, height: 16, steps: 1, guidanceScale: 0, items: [item, item] };
    // 16x16 JPEG: 256 bytes a pixel's worth plus headers, under a block; the store counts each as spaceOf(its size).
    expect(expectedStoreBytes([tiny])).toBe(2 * spaceOf(1));
  });
});

/** A url request for `n` images of the stub model, by fetch: the tests below read its raw answer, or leave it. */
const askForUrls = (baseURL: string, n: number, signal?: AbortSignal) =>
  fetch(`${baseURL}/images/generations`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'stub', prompt: 'x', n, response_format: 'url' }),
    signal,
  });

describe('a url request whose client leaves while its images are stored', () => {
  it('keeps none of them: nobody will be given their URLs', async () => {
    const server = await startTestServer({ engine: new FakeEngine() });
    try {
      const { store } = server;
      const put = store.put.bind(store);
      let storing!: () => void;
      const reached = new Promise<void>((resolve) => (storing = resolve));
      let open!: () => void;
      const gate = new Promise<void>((resolve) => (open = resolve));
      let stored = 0;
      store.put = async (...args) => {
        storing();
        await gate;
        const image = await put(...args);
        stored++;
        return image;
      };
      const leave = new AbortController();
      const answer = askForUrls(server.baseURL, 2, leave.signal).catch(() => undefined);
      await reached;
      leave.abort();
      await answer;
      // The server heard the client leave.
      await expect.poll(() => server.engine.signals[0]?.aborted).toBe(true);
      open();
      await expect.poll(() => stored).toBe(2);
      await expect.poll(() => store.stats().files).toBe(0);
    } finally {
      await server.close();
    }
  });
});

describe('a url request one of whose images cannot be stored', () => {
  it('keeps none of the others: the answer names all its images or none, and those stored would only take space', async () => {
    const server = await startTestServer({ engine: new FakeEngine() });
    try {
      const { store } = server;
      const put = store.put.bind(store);
      let puts = 0;
      // The disk fills as the second image is written (what a disk without MAX_STORE_BYTES does).
      store.put = async (...args) => {
        if (++puts === 2) throw Object.assign(new Error('no space left on device'), { code: 'ENOSPC' });
        return put(...args);
      };
      const res = await askForUrls(server.baseURL, 3);
      expect(res.status).toBe(500);
      expect(((await res.json()) as ErrorBody).error).toMatchObject({ code: 'storage_error', message: expect.stringContaining('(ENOSPC)') });
      expect(puts).toBe(3);
      expect(store.stats().files).toBe(0);
    } finally {
      await server.close();
    }
  });
});
