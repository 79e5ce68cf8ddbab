import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { ListObjectsV2Command, S3Client } from '@aws-sdk/client-s3';
import OpenAI from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MODEL, makeRoot, OPS_KEY, rootEnv, sleep, untilReady } from './helpers/ops-server.js';
import { holdProcesses } from './helpers/busy-worker.js';
import { postWithoutHost } from './helpers/raw-http.js';
import { killServer, spawnServer, workerProcesses, type ServerProcess } from './helpers/server-process.js';
import { findCommand, startHaproxy, startOn, startRedis, startS3Server, type HaproxyService, type RedisService, type S3Service } from './helpers/services.js';
import type { ErrorBody, ImagesResponse } from '../src/api/wire.js';

/**
 * Two `imagegen serve` processes on loopback, sharing an S3-compatible bucket (s3rver) and a real Redis,
 * behind a real HAProxy running deploy/haproxy.cfg: the cluster of docs/deploy.md, on one machine.
 * The tests run in order, each from where the one before left the cluster.
 */

const REDIS = findCommand('redis-server');
const HAPROXY = findCommand('haproxy');
const missing = [!REDIS && 'redis-server', !HAPROXY && 'haproxy'].filter(Boolean).join(' and ');
if (missing) console.warn(`test/replicas.test.ts skipped: ${missing} not found (install with: apt-get install haproxy redis-server)`);

const BUCKET = 'imagegen';
/** A key of API_KEYS_FILE with a limit small enough to reach in a test. */
const LIMITED = { label: 'limited', key: 'sk-limited-0123456789abcdef', requestsPerMinute: 3 };

let dir: string;
let root: string;
let s3: S3Service;
let redis: RedisService;
let haproxy: HaproxyService;
const replicas: { a?: ServerProcess; b?: ServerProcess } = {};
/** Each replica's port, found free as it first starts (see startOn); a restart takes it again, where HAProxy looks. */
const ports: { a?: number; b?: number } = {};
/** Image URLs made so far, and the replica that made each: none may be lost. */
const stored: { path: string; madeOn: 'a' | 'b' }[] = [];

function replicaEnv(name: 'a' | 'b', port: number, extra: Record<string, string> = {}): Record<string, string> {
  return {
    ...rootEnv(root),
    DATA_DIR: path.join(root, `data-${name}`),
    PORT: String(port),
    STORE: 's3',
    S3_BUCKET: BUCKET,
    S3_ENDPOINT: s3.endpoint,
    S3_FORCE_PATH_STYLE: 'true',
    // Credentials and region the standard AWS way, as in production.
    ...s3.credentials,
    REDIS_URL: redis.url,
    API_KEYS_FILE: path.join(dir, 'keys'),
    // Image URLs made through the balancer name the balancer.
    TRUST_PROXY: '127.0.0.1',
    ...extra,
  };
}

async function startReplica(name: 'a' | 'b', extra?: Record<string, string>): Promise<ServerProcess> {
  const server = await startOn(ports[name], (port) => spawnServer(replicaEnv(name, port, extra)));
  replicas[name] = server;
  ports[name] = Number(new URL(server.origin).port);
  await untilReady(server.origin, 60_000).catch(async (err: Error) => {
    throw new Error(`${err.message}: /ready says ${await (await fetch(`${server.origin}/ready`)).text()}`);
  });
  return server;
}

const client = (origin: string, apiKey = OPS_KEY) => new OpenAI({ baseURL: `${origin}/v1`, apiKey, maxRetries: 0 });
/** A quick generation's URL; extension fields ride along as the SDK's extra body keys. */
async function makeImage(origin: string): Promise<string> {
  const { data } = await client(origin).images.generate({ model: MODEL, prompt: 'a blue square', response_format: 'url', size: '128x128' as '256x256', steps: 2 } as OpenAI.ImageGenerateParamsNonStreaming);
  return data![0].url!;
}

/** GETs an image path from `origin`: its status, and when 200 its width as sharp decodes it. */
async function load(origin: string, imagePath: string): Promise<{ status: number; width?: number; body: Buffer }> {
  const res = await fetch(`${origin}${imagePath}`);
  const body = Buffer.from(await res.arrayBuffer());
  return { status: res.status, body, ...(res.status === 200 && { width: (await sharp(body).metadata()).width }) };
}

const origins = () => ({ balancer: haproxy.origin, a: replicas.a!.origin, b: replicas.b!.origin });

/** Waits until HAProxy's health checks on /ready have every replica UP. */
async function untilBalanced(): Promise<void> {
  const deadline = Date.now() + 20_000;
  let servers = await haproxy.servers();
  while (Object.values(servers).some((status) => status !== 'UP')) {
    if (Date.now() > deadline) throw new Error(`HAProxy does not see every replica ready: ${JSON.stringify(servers)}`);
    await sleep(100);
    servers = await haproxy.servers();
  }
  expect(Object.keys(servers)).toEqual(['replica1', 'replica2']);
}

async function queueOf(origin: string): Promise<number> {
  const { queue } = (await (await fetch(`${origin}/health`)).json()) as { queue: { running: number; queued: number } };
  return queue.running + queue.queued;
}

describe.skipIf(missing)(`replicas behind HAProxy sharing S3 and Redis${missing ? ` (skipped: ${missing} not found, install with apt-get install haproxy redis-server)` : ''}`, () => {
  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-replicas-'));
    root = await makeRoot();
    await mkdir(path.join(dir, 's3'));
    await writeFile(path.join(dir, 'keys'), `${LIMITED.label}:${LIMITED.key} requests_per_minute=${LIMITED.requestsPerMinute}\n`);
    [s3, redis] = await Promise.all([startS3Server(path.join(dir, 's3'), BUCKET), startRedis(REDIS!)]);
    await Promise.all([startReplica('a'), startReplica('b')]);
    haproxy = await startHaproxy(HAPROXY!, [`127.0.0.1:${ports.a}`, `127.0.0.1:${ports.b}`], { CHECK_INTERVAL: '250ms' });
    await untilBalanced();
  }, 120_000);

  afterAll(async () => {
    await haproxy?.stop();
    for (const server of Object.values(replicas)) if (server) await killServer(server);
    await Promise.all([s3?.stop(), redis?.stop()]);
    await Promise.all([dir && rm(dir, { recursive: true, force: true }), root && rm(root, { recursive: true, force: true })]);
  });

  it('serves an image URL made on one replica from the other, and through the balancer', async () => {
    const url = await makeImage(replicas.a!.origin);
    const imagePath = new URL(url).pathname;
    const fromMaker = await load(replicas.a!.origin, imagePath);
    expect(fromMaker).toMatchObject({ status: 200, width: 128 });
    for (const origin of [replicas.b!.origin, haproxy.origin]) {
      const other = await load(origin, imagePath);
      expect(other.status).toBe(200);
      expect(other.body.equals(fromMaker.body)).toBe(true);
    }
    stored.push({ path: imagePath, madeOn: 'a' });

    // Made through the balancer, the URL names the balancer (X-Forwarded-Host from a trusted proxy).
    const viaBalancer = await makeImage(haproxy.origin);
    expect(viaBalancer.startsWith(`${haproxy.origin}/v1/images/files/`)).toBe(true);
    for (const origin of Object.values(origins())) expect((await load(origin, new URL(viaBalancer).pathname)).status).toBe(200);
    stored.push({ path: new URL(viaBalancer).pathname, madeOn: 'a' });
  });

  it('names the address the balancer was reached on in image URLs for an HTTP/1.0 client that sends no Host', async () => {
    const body = JSON.stringify({ model: MODEL, prompt: 'a blue square', size: '128x128', steps: 2, response_format: 'url' });
    const answer = await postWithoutHost(Number(new URL(haproxy.origin).port), '/v1/images/generations', `Bearer ${OPS_KEY}`, body);
    expect(answer.status).toMatch(/^HTTP\/1\.1 200 /);
    const { data } = JSON.parse(answer.body) as ImagesResponse;
    // Not the replica's own address, which clients of a balancer may not reach.
    expect(data[0].url!.startsWith(`${haproxy.origin}/v1/images/files/`)).toBe(true);
    expect((await load(haproxy.origin, new URL(data[0].url!).pathname)).status).toBe(200);
  });

  it("holds a key's requests_per_minute across replicas (counted in Redis)", async () => {
    const ask = (origin: string) =>
      client(origin, LIMITED.key)
        .images.generate({ model: MODEL, prompt: 'a red circle', response_format: 'b64_json', size: '128x128' as '256x256', steps: 1 } as OpenAI.ImageGenerateParamsNonStreaming)
        .then(
          () => 200,
          (err: InstanceType<typeof OpenAI.APIError>) => err,
        );
    const { a, b, balancer } = origins();
    // Three admitted, spread over both replicas: each alone would admit three of its own.
    expect([await ask(a), await ask(b), await ask(a)]).toEqual([200, 200, 200]);
    for (const origin of [b, a, balancer]) {
      const refused = await ask(origin);
      expect(refused).toBeInstanceOf(OpenAI.APIError);
      const err = refused as InstanceType<typeof OpenAI.APIError>;
      expect({ status: err.status, code: err.code, type: err.type }).toEqual({ status: 429, code: 'rate_limit_exceeded', type: 'requests' });
      expect(err.message).toMatch(/API key 'limited': at most 3 requests a minute/);
      expect(Number(err.headers?.get('retry-after'))).toBeGreaterThan(0);
    }
  });

  it('loses no stored image when a replica is killed mid-traffic, and fails only the requests it was running', async () => {
    stored.push({ path: new URL(await makeImage(replicas.b!.origin)).pathname, madeOn: 'b' });
    const { a, b, balancer } = origins();
    // Every batch held where it is (SIGSTOP of both replicas' workers) from before the requests until b has
    // died: b's requests when it dies are those counted on it, however fast a machine would have finished
    // some, and a's are still in flight then.
    const resume = holdProcesses([...(await workerProcesses(replicas.a!)), ...(await workerProcesses(replicas.b!))]);
    // Generations through the balancer, held as they reach a worker: a few steps, as a's run once let go
    // (60 took most of the file's worker time, long only while nothing held them); distinct step counts
    // keep them from merging into one batch.
    const requests = [0, 1, 2, 3].map((i) =>
      fetch(`${balancer}/v1/images/generations`, {
        method: 'POST',
        headers: { authorization: `Bearer ${OPS_KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt: 'a green triangle', size: '1024x1024', steps: 4 + i, response_format: 'url' }),
      }).then(
        async (res) => {
          const body = (await res.json()) as Partial<ImagesResponse> & Partial<ErrorBody>;
          return { status: res.status, url: body.data?.[0].url, code: body.error?.code };
        },
        (err: Error) => ({ status: 0, url: String(err.cause ?? err), code: undefined }),
      ),
    );
    let onB: number;
    try {
      // Every request has reached a replica (running or queued there, where none can end now), and each replica has some.
      await expect.poll(async () => [await queueOf(a), await queueOf(b)], { timeout: 20_000, interval: 20 }).toSatisfy(([x, y]: number[]) => x > 0 && y > 0 && x + y === 4);
      onB = await queueOf(b);
      await killServer(replicas.b!);
    } finally {
      // a's batches go on; b's workers, stopped, end with it once they run.
      resume();
    }

    const answers = await Promise.all(requests);
    const failed = answers.filter((answer) => answer.status !== 200);
    expect(failed).toHaveLength(onB);
    // HAProxy answers 502 for a request whose replica died under it, or, when the request came on a
    // connection that had carried others, closes that connection as a server ending a keep-alive
    // connection would (the OpenAI SDKs retry both).
    for (const answer of failed) expect([502, 0]).toContain(answer.status);
    // HAProxy's own answer in OpenAI's shape (deploy/haproxy.cfg's http-error), not its HTML page.
    for (const answer of failed.filter((x) => x.status === 502)) expect(answer.code).toBe('replica_failed');
    for (const answer of answers.filter((x) => x.status === 200)) stored.push({ path: new URL(answer.url!).pathname, madeOn: 'a' });

    // New requests go to the replica left, none is lost to the dead one.
    for (let i = 0; i < 3; i++) stored.push({ path: new URL(await makeImage(balancer)).pathname, madeOn: 'a' });
    // Every image made so far, by either replica, still loads.
    for (const image of stored) {
      for (const origin of [a, balancer]) expect([image.path, (await load(origin, image.path)).status]).toEqual([image.path, 200]);
    }
  });

  it('serves the images of a replica that was killed once it is back, from it and the balancer', async () => {
    // Restarted with a short image lifetime, for the expiry test that follows.
    await startReplica('b', { IMAGE_TTL_SECONDS: '3' });
    await untilBalanced();
    const madeOnB = stored.filter((image) => image.madeOn === 'b');
    expect(madeOnB.length).toBeGreaterThan(0);
    for (const image of stored) {
      for (const origin of [replicas.b!.origin, haproxy.origin]) expect([image.path, (await load(origin, image.path)).status]).toEqual([image.path, 200]);
    }
  });

  it('expires an image on every replica at its own expiry, before any sweep deleted it', async () => {
    const { a, b, balancer } = origins();
    // Each replica sweeps the bucket every minute, at times of its own: a sweep between the image's expiry
    // and the listing below deletes it, and the listing then cannot show what the GETs went by. s3rver logs
    // each object it deletes: so deleted, the image is made again, the sweeps a minute away by then.
    for (let attempt = 1; ; attempt++) {
      const logged = s3.output.length;
      const url = await makeImage(replicas.b!.origin);
      const imagePath = new URL(url).pathname;
      const id = path.basename(imagePath).split('.')[0];
      // Gone from the replica that did not make it, without waiting for a sweep (they run every minute).
      await expect.poll(async () => (await load(a, imagePath)).status, { timeout: 20_000, interval: 250 }).toBe(404);
      for (const origin of [b, balancer]) {
        const res = await fetch(`${origin}${imagePath}`);
        expect(res.status).toBe(404);
        expect(((await res.json()) as ErrorBody).error.code).toBe('image_not_found');
      }
      // Still in the bucket: it is the expiry in its name that every GET checks.
      const bucket = new S3Client({ endpoint: s3.endpoint, region: 'us-east-1', forcePathStyle: true, credentials: { accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER' } });
      const listed = await bucket.send(new ListObjectsV2Command({ Bucket: BUCKET, Prefix: `images/${id}.` }));
      bucket.destroy();
      if (listed.Contents?.length === 1) break;
      // Not there: only a sweep may have deleted it (its log line comes a moment after its answer), and not
      // in every try.
      const swept = () => s3.output.slice(logged).some((line) => line.includes(`Deleted object "images/${id}.`));
      await expect.poll(swept, { message: `image ${id} is gone from the bucket, and no sweep deleted it` }).toBe(true);
      expect(attempt, 'a sweep deleted the image before it was listed, in each of three tries').toBeLessThan(3);
    }
    // The long-lived images made before stay.
    expect((await load(a, stored[0].path)).status).toBe(200);
  });

  it('answers through the balancer while the shared bucket fails and no replica is ready: b64_json images, and the replicas\' 503 storage_unavailable for url requests and image GETs', async () => {
    const port = Number(new URL(s3.endpoint).port);
    await s3.stop();
    try {
      // The bucket is every replica's: each /ready fails, and HAProxy has none ready.
      await expect.poll(async () => Object.values(await haproxy.servers()).every((status) => status.startsWith('DOWN')), { timeout: 20_000, interval: 100 }).toBe(true);
      // The replicas still take the requests (deploy/haproxy.cfg's backups), rather than HAProxy's HTML 503.
      const { data } = await client(haproxy.origin).images.generate({ model: MODEL, prompt: 'a red circle', response_format: 'b64_json', size: '128x128' as '256x256', steps: 1 } as OpenAI.ImageGenerateParamsNonStreaming);
      expect((await sharp(Buffer.from(data![0].b64_json!, 'base64')).metadata()).width).toBe(128);
      const refused = await makeImage(haproxy.origin).then(
        () => expect.fail('a url request was answered without a bucket'),
        (err: InstanceType<typeof OpenAI.APIError>) => err,
      );
      expect({ status: refused.status, code: refused.code }).toEqual({ status: 503, code: 'storage_unavailable' });
      const res = await fetch(`${haproxy.origin}${stored[0].path}`);
      expect([res.status, ((await res.json()) as ErrorBody).error.code]).toEqual([503, 'storage_unavailable']);
    } finally {
      s3 = await startS3Server(path.join(dir, 's3'), BUCKET, port);
    }
    // Back by itself once the bucket is, with every image made before.
    await untilBalanced();
    for (const image of stored) expect([image.path, (await load(haproxy.origin, image.path)).status]).toEqual([image.path, 200]);
  });

  it("answers in OpenAI's shape, with Retry-After, when no replica can be reached at all", async () => {
    for (const server of Object.values(replicas)) await killServer(server!);
    const res = await fetch(`${haproxy.origin}/v1/images/generations`, {
      method: 'POST',
      headers: { authorization: `Bearer ${OPS_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'a red circle' }),
    });
    expect(res.status).toBe(503);
    expect(res.headers.get('retry-after')).toBe('5');
    expect(((await res.json()) as ErrorBody).error).toMatchObject({ type: 'server_error', code: 'no_replica_available' });
  });
});
