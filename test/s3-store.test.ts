import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { createServer, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { CreateBucketCommand, ListObjectsV2Command, S3Client } from '@aws-sdk/client-s3';
import OpenAI from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { loadConfig } from '../src/config.js';
import { ConfigError } from '../src/util/config-error.js';
import { StoreFullError, StoreUnavailableError } from '../src/store/image-store.js';
import { S3ImageStore, type S3StoreOptions } from '../src/store/s3-store.js';
import { MIN_IMAGE_BYTES } from '../src/store/space.js';
import { capturedLogs, silentLogger } from './helpers/logs.js';
import { apiError } from './helpers/failures.js';
import { MODEL, startOpsServer, untilReady } from './helpers/ops-server.js';
import { startS3Server, type S3Service } from './helpers/services.js';

/**
 * The S3 image store against s3rver, an S3-wire-compatible server run as its own process (production
 * uses a real object store: AWS S3, MinIO, Ceph RGW, R2, Garage), and a real server in front of it.
 */

const BUCKET = 'images-test';
let dir: string;
let s3: S3Service;
/** The stores' clock: tests move it on instead of waiting for images to expire. */
let now = Date.UTC(2026, 10, 23);

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-s3-'));
  await mkdir(path.join(dir, 's3'));
  s3 = await startS3Server(path.join(dir, 's3'), BUCKET);
  // The store's credentials come from the standard AWS variables, as in production.
  for (const [name, value] of Object.entries(s3.credentials)) vi.stubEnv(name, value);
});
afterAll(async () => {
  vi.unstubAllEnvs();
  await s3?.stop();
  await rm(dir, { recursive: true, force: true });
});

const open = (options: Partial<S3StoreOptions> = {}) =>
  S3ImageStore.open({
    bucket: BUCKET,
    prefix: 'images/',
    endpoint: s3.endpoint,
    forcePathStyle: true,
    presignedUrls: false,
    ttlSeconds: 60,
    maxBytes: 1e6,
    logger: silentLogger,
    clock: () => now,
    ...options,
  });

const bytes = (n: number, fill = 1) => new Uint8Array(n).fill(fill);
/** The least an image counts against the limit (space.ts): the small images here count a block each. */
const BLOCK = MIN_IMAGE_BYTES;
const readAll = async (stream: Readable | null) => stream && Buffer.concat(await stream.toArray());

async function keys(prefix: string): Promise<string[]> {
  const client = new S3Client({ endpoint: s3.endpoint, forcePathStyle: true });
  try {
    return ((await client.send(new ListObjectsV2Command({ Bucket: BUCKET, Prefix: prefix }))).Contents ?? []).map((o) => o.Key!);
  } finally {
    client.destroy();
  }
}

/**
 * A gateway in front of the bucket that answers DeleteObjects as another S3-compatible store might:
 * `refusal` gives the S3 error code it refuses one with (its Content-MD5 header and body at hand), or
 * undefined to pass it on; everything else goes through.
 */
async function deleteGateway(refusal: (md5: string | undefined, body: Buffer) => string | undefined) {
  const refused: string[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const code = new URL(req.url!, s3.endpoint).searchParams.has('delete') ? refusal(req.headers['content-md5']?.toString(), body) : undefined;
      if (code) {
        refused.push(code);
        res.writeHead(code === 'NotImplemented' ? 501 : 400, { 'content-type': 'application/xml' }).end(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>${code}</Code><Message>refused by the gateway</Message></Error>`);
        return;
      }
      const upstream = httpRequest(new URL(req.url!, s3.endpoint), { method: req.method, headers: req.headers }, (answer) => {
        res.writeHead(answer.statusCode!, answer.headers);
        answer.pipe(res);
      });
      upstream.end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { endpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, refused, close: () => server.close() };
}

describe('S3ImageStore', () => {
  it('stores one object per image, named <id>.<expiry>.<ext> under the prefix, and streams it back', async () => {
    const store = await open({ prefix: 'roundtrip/' });
    const data = Uint8Array.from({ length: 100 }, (_, i) => i);
    const image = await store.put(data, 'image/webp');
    expect(image).toMatchObject({ ext: 'webp', contentType: 'image/webp', size: 100, expiresAt: now + 60_000 });
    expect(await keys('roundtrip/')).toEqual([`roundtrip/${image.id}.${image.expiresAt}.webp`]);
    expect(await store.get(image.id)).toEqual(image);
    expect(await readAll(await store.read(image))).toEqual(Buffer.from(data));
    // A byte range (an HTTP Range request's) reads only those bytes from the bucket.
    expect(await readAll(await store.read(image, { start: 10, end: 19 }))).toEqual(Buffer.from(data.subarray(10, 20)));
    expect(await store.get('0'.repeat(32))).toBeNull();
    expect(store.stats()).toEqual({ files: 1, bytes: BLOCK });
    // Deleted since it was looked up (by another replica, or the bucket's lifecycle rule): gone (a 404), not a failing bucket (a 503).
    const other = await open({ prefix: 'roundtrip/' });
    await other.remove([image]);
    await other.close();
    expect(await store.read(image)).toBeNull();
    await store.close();
  });

  it('refuses an expired image at every GET before the sweeper deleted it, then the sweep deletes the object', async () => {
    const store = await open({ prefix: 'expiry/', ttlSeconds: 1 });
    const image = await store.put(bytes(10), 'image/png');
    now += 1001;
    expect(await store.get(image.id)).toBeNull();
    expect(await store.read(image)).toBeNull();
    expect(await keys('expiry/')).toHaveLength(1);
    await store.sweep();
    expect(await keys('expiry/')).toHaveLength(0);
    expect(store.stats()).toEqual({ files: 0, bytes: 0 });
    await store.close();
  });

  it("shares images between replicas: one serves another's, a restart counts what the bucket holds, and the byte limit spans them", async () => {
    const [one, two] = [await open({ prefix: 'shared/', maxBytes: 2.5 * BLOCK }), await open({ prefix: 'shared/', maxBytes: 2.5 * BLOCK })];
    const image = await one.put(bytes(100, 3), 'image/png');
    expect(await readAll(await two.read((await two.get(image.id))!))).toEqual(Buffer.from(bytes(100, 3)));
    await two.put(bytes(100), 'image/png');
    // `one` has not listed since `two` wrote: a block and a half more look as if they fit, until a sweep lists the
    // bucket (every minute, and whenever a put finds the store full).
    await one.sweep();
    expect(one.stats()).toEqual({ files: 2, bytes: 2 * BLOCK });
    await expect(one.put(bytes(100), 'image/png')).rejects.toBeInstanceOf(StoreFullError);
    await expect(one.reserve(0.6 * BLOCK)).rejects.toBeInstanceOf(StoreFullError);

    // Another replica starting later (or this one restarted) sees them all.
    const three = await open({ prefix: 'shared/', maxBytes: 2.5 * BLOCK });
    expect(three.stats()).toEqual({ files: 2, bytes: 2 * BLOCK });
    // Once they expire, the sweep a full store runs deletes them and makes room.
    now += 61_000;
    await three.put(bytes(200), 'image/png');
    expect(await keys('shared/')).toHaveLength(1);
    await Promise.all([one.close(), two.close(), three.close()]);
  });

  it("times expiry by the bucket's clock too: a replica whose clock runs ten minutes ahead neither deletes nor refuses another's image early, nor makes its own live shorter", async () => {
    // The replicas' own clocks (Date.now), not a test's, as servers run.
    const maker = await open({ prefix: 'skew/', clock: undefined });
    const image = await maker.put(bytes(10), 'image/png');
    const real = Date.now;
    const ahead = vi.spyOn(Date, 'now').mockImplementation(() => real() + 600_000);
    try {
      // Its start-up sweep lists the prefix, and deleted the image: expired by its clock.
      const skewed = await open({ prefix: 'skew/', clock: undefined });
      expect(await skewed.get(image.id)).toEqual(image);
      // Made at the later clock, its own: it may outlive its minute by the skew, never fall short of it.
      const own = await skewed.put(bytes(10), 'image/png');
      expect(Math.abs(own.expiresAt - (real() + 600_000 + 60_000))).toBeLessThan(3000);
    } finally {
      ahead.mockRestore();
    }
    expect(await keys('skew/')).toContain(`skew/${image.id}.${image.expiresAt}.png`);
  });

  it("does not take a wrong Date header for the time: a replica whose bucket answers through a gateway four minutes ahead deletes no image early", async () => {
    // A gateway in front of the bucket whose clock runs four minutes ahead: every answer's Date says so
    // (less than the five minutes from which the SDK itself would take the Date for its signatures).
    const gateway = createServer((req, res) => {
      const upstream = httpRequest(new URL(req.url!, s3.endpoint), { method: req.method, headers: req.headers }, (answer) => {
        res.writeHead(answer.statusCode!, { ...answer.headers, date: new Date(Date.now() + 240_000).toUTCString() });
        answer.pipe(res);
      });
      req.pipe(upstream);
    });
    await new Promise<void>((resolve) => gateway.listen(0, '127.0.0.1', resolve));
    try {
      const maker = await open({ prefix: 'gateway/', clock: undefined });
      const image = await maker.put(bytes(10), 'image/png');
      // Its start-up sweep lists the prefix through the gateway: by the gateway's clock the minute's image expired.
      const misled = await open({ prefix: 'gateway/', clock: undefined, endpoint: `http://127.0.0.1:${(gateway.address() as AddressInfo).port}` });
      expect(await misled.get(image.id)).toEqual(image);
      await misled.close();
      expect(await keys('gateway/')).toContain(`gateway/${image.id}.${image.expiresAt}.png`);
      await maker.close();
    } finally {
      gateway.close();
    }
  });

  it('deletes through a store that takes DeleteObjects only with Content-MD5 (older MinIO releases, Oracle Object Storage): refused, no sweep got past its deletes, so expired images stayed counted and a full store answered every url request 503', async () => {
    // Answered as those stores do: no Content-MD5 (the SDK sends a CRC32 header instead, even with
    // WHEN_REQUIRED) is a 400 MissingContentMD5, a wrong one BadDigest.
    const gateway = await deleteGateway((md5, body) => (!md5 ? 'MissingContentMD5' : md5 !== createHash('md5').update(body).digest('base64') ? 'BadDigest' : undefined));
    try {
      const store = await open({ prefix: 'md5-deletes/', maxBytes: 2 * BLOCK, endpoint: gateway.endpoint });
      const [first, second] = [await store.put(bytes(10), 'image/png'), await store.put(bytes(10), 'image/png')];
      // A failed response's images, deleted at once.
      await store.remove([second]);
      expect(await keys('md5-deletes/')).toEqual([`md5-deletes/${first.id}.${first.expiresAt}.png`]);
      // Expired, the sweep a full store runs deletes it and makes room.
      now += 61_000;
      await store.put(bytes(10), 'image/png');
      await store.put(bytes(10), 'image/png');
      expect(await keys('md5-deletes/')).toHaveLength(2);
      expect(gateway.refused).toEqual([]);
      await store.close();
    } finally {
      gateway.close();
    }
  });

  it("counts what a sweep listed though its deletes fail (a store without DeleteObjects, one throttling it): the put that swept for room got 503, the expired images still counted", async () => {
    const gateway = await deleteGateway(() => 'NotImplemented');
    const logs = capturedLogs<{ msg: string }>();
    try {
      const store = await open({ prefix: 'failed-deletes/', maxBytes: 2 * BLOCK, endpoint: gateway.endpoint, logger: logs.logger });
      await Promise.all([store.put(bytes(10), 'image/png'), store.put(bytes(10), 'image/png')]);
      now += 61_000;
      // The listing finds nothing unexpired: room, whatever the deletes meet.
      await store.put(bytes(10), 'image/png');
      expect(store.stats()).toEqual({ files: 1, bytes: BLOCK });
      // Left for a later sweep (and the bucket's lifecycle rule), and said so.
      expect(await keys('failed-deletes/')).toHaveLength(3);
      expect(gateway.refused).toEqual(['NotImplemented']);
      expect(logs.lines.map((line) => line.msg)).toContainEqual(expect.stringMatching(/failed to delete images \(NotImplemented.*: 2 expired images stay until a later sweep/));
      await store.close();
    } finally {
      gateway.close();
    }
  });

  /** When a presigned URL was signed (its X-Amz-Date, whole seconds), unix milliseconds. */
  const signedAt = (url: URL) => Date.parse(url.searchParams.get('X-Amz-Date')!.replace(/^(\d{4})(\d\d)(\d\d)T(\d\d)(\d\d)(\d\d)Z$/, '$1-$2-$3T$4:$5:$6Z'));

  /**
   * The presigned URL of an image of `fill` stored by a replica whose clock runs ten minutes behind the
   * bucket's, once it has downloaded that image (judged by the bucket, on its clock).
   */
  async function presignedFromBehind(options: { prefix: string; ttlSeconds?: number }, fill: number): Promise<URL> {
    // Date itself (new Date() too, which the SDK's signer reads), not just Date.now; timers stay real.
    vi.useFakeTimers({ toFake: ['Date'], now: Date.now() - 600_000 });
    try {
      const store = await open({ ...options, presignedUrls: true, clock: undefined });
      const url = new URL((await store.put(bytes(10, fill), 'image/png')).url!);
      const res = await fetch(url);
      expect(res.status).toBe(200);
      expect(Buffer.from(await res.arrayBuffer())).toEqual(Buffer.from(bytes(10, fill)));
      await store.close();
      return url;
    } finally {
      vi.useRealTimers();
    }
  }

  it("signs presigned URLs on the bucket's clock: a replica whose clock runs ten minutes behind hands out URLs that live as long as the image", async () => {
    const url = await presignedFromBehind({ prefix: 'skew-presigned/' }, 7);
    // Signed at the bucket's time (the store learnt it from the start-up sweep's listing), not this machine's.
    expect(Math.abs(signedAt(url) - Date.now())).toBeLessThan(3000);
  });

  it('hands out presigned URLs for the longest lifetime (IMAGE_TTL_SECONDS=604800) from a replica whose clock is off the bucket\'s, within the 7 days a signature may last', async () => {
    // Counted from the earlier clock, the URL's lifetime came to 7 days and the skew, which the signer
    // refuses: every url request got a 500 storage_error, its image left in the bucket.
    const url = await presignedFromBehind({ prefix: 'week-presigned/', ttlSeconds: 604_800 }, 5);
    // A week on the bucket's clock, which judges the URL and from which the image's lifetime started.
    expect(url.searchParams.get('X-Amz-Expires')).toBe('604800');
  });

  it('deletes the images of a response that failed, so none of its n images stays visible', async () => {
    const store = await open({ prefix: 'remove/' });
    const images = await Promise.all([1, 2, 3].map((fill) => store.put(bytes(10, fill), 'image/jpeg')));
    await store.remove(images);
    expect(await keys('remove/')).toEqual([]);
    expect(store.stats()).toEqual({ files: 0, bytes: 0 });
    await store.close();
  });

  it('hands out presigned URLs that load the image from the bucket and expire with it', async () => {
    const store = await open({ prefix: 'presigned/', presignedUrls: true, ttlSeconds: 600 });
    const image = await store.put(bytes(20, 9), 'image/png');
    const url = new URL(image.url!);
    expect(url.origin).toBe(s3.endpoint);
    // Known from the start, for the playground's policy (app.ts): the page may load images from there.
    expect(store.urlOrigin).toBe(s3.endpoint);
    expect(url.pathname).toBe(`/${BUCKET}/presigned/${image.id}.${image.expiresAt}.png`);
    // The lifetime, and the part of a second the signature's date was cut by (see the next test).
    expect(['600', '601']).toContain(url.searchParams.get('X-Amz-Expires'));
    const res = await fetch(url);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('image/png');
    // Cached until the image expires, however late it is fetched: an absolute date, no max-age.
    expect([res.headers.get('cache-control'), res.headers.get('expires')]).toEqual(['public, immutable', new Date(image.expiresAt).toUTCString()]);
    expect(Buffer.from(await res.arrayBuffer())).toEqual(Buffer.from(bytes(20, 9)));
    await store.close();
  });

  it('hands out presigned URLs that live no shorter than their image, though a signature counts whole seconds', async () => {
    // This machine's clock: counted from now and rounded down, from a date cut to its second, the URL died up to two seconds early.
    const store = await open({ prefix: 'whole-seconds/', presignedUrls: true, ttlSeconds: 300, clock: undefined });
    for (const fill of [1, 2, 3]) {
      const image = await store.put(bytes(10, fill), 'image/png');
      const url = new URL(image.url!);
      expect(signedAt(url) + Number(url.searchParams.get('X-Amz-Expires')) * 1000).toBeGreaterThanOrEqual(image.expiresAt);
    }
    await store.close();
  });

  it('says which bucket failed and why: StoreUnavailableError from check(), put() and get()', async () => {
    const store = await open({ bucket: 'no-such-bucket' });
    const failure = await store.check().catch((err: unknown) => err);
    expect(failure).toBeInstanceOf(StoreUnavailableError);
    expect(failure).toMatchObject({ reason: 'NoSuchBucket', message: expect.stringMatching(/the S3 bucket 'no-such-bucket' failed to answer \(NoSuchBucket/) });
    await expect(store.put(bytes(1), 'image/png')).rejects.toMatchObject({ name: 'StoreUnavailableError', reason: 'NoSuchBucket' });
    await expect(store.get('0'.repeat(32))).rejects.toBeInstanceOf(StoreUnavailableError);
    await store.close();

    const unreachable = await open({ endpoint: 'http://127.0.0.1:9' });
    await expect(unreachable.check()).rejects.toMatchObject({ reason: 'ECONNREFUSED' });
    await unreachable.close();
  });

  it('asks the bucket again a few seconds after a failed check, though the wall clock stepped back an hour meanwhile', async () => {
    const store = await open({ bucket: 'made-later' });
    vi.useFakeTimers({ toFake: ['Date', 'performance'] });
    try {
      await expect(store.check()).rejects.toMatchObject({ reason: 'NoSuchBucket' });
      await new S3Client({ endpoint: s3.endpoint, forcePathStyle: true }).send(new CreateBucketCommand({ Bucket: 'made-later' }));
      vi.setSystemTime(Date.now() - 3600_000);
      vi.advanceTimersByTime(3000);
      // On the wall clock the cached failure lay an hour ahead, and /ready would have said 503 for that hour.
      await expect(store.check()).resolves.toBeUndefined();
    } finally {
      vi.useRealTimers();
      await store.close();
    }
  });

  it('fails requests to a bucket that stops answering once they time out, instead of waiting for as long as it is silent', async () => {
    const store = await open({ prefix: 'stalled/', requestTimeoutMs: 1000 });
    const image = await store.put(bytes(10), 'image/png');
    // The S3 server still holds its connections but answers nothing, as a stalled store or a half-open network does.
    s3.child.kill('SIGSTOP');
    try {
      for (const call of [() => store.get(image.id), () => store.read(image), () => store.put(bytes(10), 'image/png'), () => store.check()]) {
        const started = performance.now();
        await expect(call()).rejects.toBeInstanceOf(StoreUnavailableError);
        // The limit holds for the request with its retries (the SDK's backoff between tries adds a little):
        // a limit for each of its three tries would take 3 s at least, as timers never fire early, so a
        // bound just under that still tells them apart and leaves a loaded machine the most room.
        expect(performance.now() - started).toBeLessThan(2900);
      }
    } finally {
      s3.child.kill('SIGCONT');
    }
    expect(await store.get(image.id)).toEqual(image);
    await store.close();
  });

  it("streams an image to a reader that pauses longer than the bucket's time limit, yet fails one the bucket stops sending mid-way", async () => {
    // Each try's limit 500 ms: a pause of 1.5 s is three of them (the files route lets a client pause for SEND_TIMEOUT_SECONDS, a minute).
    const store = await open({ prefix: 'paused/', requestTimeoutMs: 1500, maxBytes: 64e6 });
    // Larger than the buffers between the bucket and the reader, so that the reader's pause holds the bucket's connection idle.
    const data = Uint8Array.from({ length: 8 << 20 }, (_, i) => (i * 7919) % 251);
    const image = await store.put(data, 'image/png');
    const paused = await store.read(image);
    const chunks: Buffer[] = [];
    for await (const chunk of paused!) {
      if (chunks.length === 0) await new Promise((resolve) => setTimeout(resolve, 1500));
      chunks.push(chunk as Buffer);
    }
    // The SDK's socket limit counted the pause as the bucket's silence: the download broke off after 500 ms of it.
    expect(Buffer.concat(chunks).equals(Buffer.from(data))).toBe(true);

    // A bucket that stops sending while the reader waits for more still fails it, within the limit.
    const stalled = (await store.read(image))!;
    let got = 0;
    stalled.once('data', () => s3.child.kill('SIGSTOP'));
    try {
      const started = performance.now();
      await expect(
        (async () => {
          for await (const chunk of stalled) got += (chunk as Buffer).length;
        })(),
      ).rejects.toMatchObject({ name: 'TimeoutError' });
      expect(got).toBeLessThan(data.length);
      expect(performance.now() - started).toBeLessThan(2900);
    } finally {
      s3.child.kill('SIGCONT');
    }
    await store.close();
  });

  it("leaves the bucket's other requests their connections while slow clients download images: 50 of them took all the SDK's, and /ready failed", async () => {
    // 2 s a try: a machine under load (CI's, shared) can take 500 ms to answer. The requests queued behind
    // the downloads (what this shows) would still fail: the downloads hold their sockets for good.
    const store = await open({ prefix: 'slow/', requestTimeoutMs: 6000, maxBytes: 64e6 });
    const image = await store.put(bytes(8 << 20), 'image/png');
    // Each takes a little every 100 ms, within the socket limit (2 s a try) as a slow client's download is.
    const slow = await Promise.all(Array.from({ length: 50 }, () => store.read(image)));
    const trickle = setInterval(() => slow.forEach((download) => download!.read()), 100);
    try {
      // Queued for a socket, /ready's check, lookups and puts failed ("failed to answer") though the bucket was fine.
      await expect(store.check()).resolves.toBeUndefined();
      expect(await store.get(image.id)).toEqual(image);
      await expect(store.put(bytes(10), 'image/png')).resolves.toMatchObject({ size: 10 });
    } finally {
      clearInterval(trickle);
      for (const download of slow) download!.destroy();
    }
    await store.close();
  });
});

describe('a server with STORE=s3 whose bucket fails', () => {
  it('answers 503 in OpenAI shape for url requests and image GETs, says why in /ready, and keeps serving b64_json', async () => {
    const ops = await startOpsServer({ env: { STORE: 's3', S3_BUCKET: BUCKET, S3_PREFIX: 'server/', S3_ENDPOINT: s3.endpoint, S3_FORCE_PATH_STYLE: 'true' } });
    const origin = ops.server.url;
    const ask = (response_format: 'url' | 'b64_json') =>
      ops.client.images.generate({ model: MODEL, prompt: 'a red circle', size: '128x128' as '256x256', response_format, steps: 1 } as OpenAI.ImageGenerateParamsNonStreaming);
    try {
      await untilReady(origin);
      const { data } = await ask('url');
      const imagePath = new URL(data![0].url!).pathname;
      const served = await fetch(`${origin}${imagePath}`);
      expect(served.status).toBe(200);
      const body = Buffer.from(await served.arrayBuffer());
      expect((await sharp(body).metadata()).width).toBe(128);
      // A HEAD answers from the listing: the object is not downloaded from the bucket to be thrown away.
      // s3rver logs each request's path and query (its GetObject calls marked x-id=GetObject).
      const objectGets = () => s3.output.filter((line) => line.includes(`/server/${imagePath.split('/').pop()!.split('.')[0]}.`) && line.includes('x-id=GetObject')).length;
      // s3rver's log line comes through its stdout a moment after its answer: wait for the GET's before counting.
      await expect.poll(objectGets, { interval: 25 }).toBe(1);
      const head = await fetch(`${origin}${imagePath}`, { method: 'HEAD' });
      expect([head.status, head.headers.get('content-length'), head.headers.get('content-type')]).toEqual([200, String(body.length), 'image/png']);
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(objectGets()).toBe(1);

      // The bucket goes away (the S3 server stops); the server stays up.
      await s3.stop();
      // /ready asks the bucket at most every 2 s (probes come often).
      await expect.poll(async () => (await fetch(`${origin}/ready`)).status, { timeout: 10_000, interval: 250 }).toBe(503);
      const ready = await fetch(`${origin}/ready`);
      expect(ready.headers.get('retry-after')).toBe('5');
      expect((await ready.json()).error).toMatchObject({ code: 'storage_unavailable', message: expect.stringMatching(/image store cannot be used: the S3 bucket 'images-test' failed to answer \(ECONNREFUSED/) });

      const err = await apiError(ask('url'));
      expect({ status: err.status, type: err.type, code: err.code }).toEqual({ status: 503, type: 'server_error', code: 'storage_unavailable' });
      expect(err.message).toMatch(/image store cannot be used right now \(ECONNREFUSED\).*b64_json/);
      expect((await ask('b64_json')).data![0].b64_json).toBeTruthy();

      const image = await fetch(`${origin}${imagePath}`);
      expect(image.status).toBe(503);
      expect((await image.json()).error).toMatchObject({ code: 'storage_unavailable', type: 'server_error' });

      // Back again (same port, same objects): ready, and the image loads.
      s3 = await startS3Server(path.join(dir, 's3'), BUCKET, Number(new URL(s3.endpoint).port));
      await untilReady(origin);
      expect((await fetch(`${origin}${imagePath}`)).status).toBe(200);
    } finally {
      await ops.close();
    }
  });
});

describe('STORE=s3 settings', () => {
  it('refuses to open without a region: every request would fail to be signed for as long as the server ran', async () => {
    vi.stubEnv('AWS_REGION', '');
    // No profile's region either (the machine's own ~/.aws files, if any).
    vi.stubEnv('AWS_CONFIG_FILE', path.join(dir, 'no-such-config'));
    try {
      const refused = await open().then(() => undefined, (err: unknown) => err);
      expect(refused).toBeInstanceOf(ConfigError);
      expect((refused as ConfigError).problems).toEqual([expect.stringMatching(/^S3_REGION \(--s3-region\): STORE=s3 needs a region, .*set S3_REGION/)]);
      await (await open({ region: 'us-east-1' })).close();
    } finally {
      vi.unstubAllEnvs();
      for (const [name, value] of Object.entries(s3.credentials)) vi.stubEnv(name, value);
    }
  });

  const problems = (env: Record<string, string>) => {
    try {
      loadConfig({}, env);
    } catch (err) {
      return (err as ConfigError).problems;
    }
    return [];
  };

  it('needs a bucket, and presigned URLs only with STORE=s3 and lifetimes a presigned URL can have', () => {
    expect(problems({ STORE: 's3' })).toEqual([expect.stringMatching(/STORE=s3 needs S3_BUCKET/)]);
    expect(problems({ S3_PRESIGNED_URLS: 'true' })).toEqual([expect.stringMatching(/S3_PRESIGNED_URLS needs STORE=s3/)]);
    // A STORE forgotten: the images would stay on this machine's disk, where the other replicas cannot serve them.
    expect(problems({ S3_BUCKET: 'b', S3_ENDPOINT: 'http://minio:9000', S3_FORCE_PATH_STYLE: 'true' })).toEqual([
      'S3_BUCKET, S3_ENDPOINT, S3_FORCE_PATH_STYLE need STORE=s3: set it, or unset them to keep images in DATA_DIR/images (STORE=fs)',
    ]);
    expect(problems({ STORE: 'fs', S3_REGION: 'us-east-1' })).toEqual(['S3_REGION needs STORE=s3: set it, or unset it to keep images in DATA_DIR/images (STORE=fs)']);
    expect(problems({ S3_FORCE_PATH_STYLE: 'false' })).toEqual([]);
    // S3_PREFIX as well (the README says every S3_* setting): it was let through, and the images went to DATA_DIR/images.
    expect(problems({ S3_PREFIX: 'app-a/' })).toEqual(['S3_PREFIX needs STORE=s3: set it, or unset it to keep images in DATA_DIR/images (STORE=fs)']);
    expect(problems({ S3_PREFIX: 'images/' })).toEqual([]);
    expect(problems({ STORE: 's3', S3_BUCKET: 'b', S3_PRESIGNED_URLS: 'true', IMAGE_TTL_SECONDS: '604801' })).toEqual([expect.stringMatching(/at most 604800/)]);
    expect(problems({ STORE: 'gcs' })[0]).toMatch(/^STORE \(--store\)/);
    expect(problems({ REDIS_URL: 'localhost:6379' })[0]).toMatch(/REDIS_URL.*redis:\/\//);
    expect(loadConfig({}, { STORE: 's3', S3_BUCKET: 'b', S3_ENDPOINT: 'http://minio:9000/', REDIS_URL: 'redis://r:6379/0' })).toMatchObject({
      store: 's3',
      s3Bucket: 'b',
      s3Prefix: 'images/',
      s3Endpoint: 'http://minio:9000',
      s3ForcePathStyle: false,
      s3PresignedUrls: false,
      redisUrl: 'redis://r:6379/0',
    });
  });
});
