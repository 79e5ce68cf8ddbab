import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { request } from 'node:http';
import os from 'node:os';
import path from 'node:path';
import OpenAI, { toFile } from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MODEL, makeRoot, OPS_KEY, rootEnv, untilReady } from './helpers/ops-server.js';
import { holdProcesses } from './helpers/busy-worker.js';
import { apiError } from './helpers/failures.js';
import { announcedForm, postWithoutHost } from './helpers/raw-http.js';
import { killServer, spawnServer, workerProcesses, type ServerProcess } from './helpers/server-process.js';
import { findCommand, startNginx, startS3Server, type NginxService, type S3Service } from './helpers/services.js';
import type { ErrorBody } from '../src/api/wire.js';

/**
 * Two `imagegen serve` processes on loopback sharing an S3-compatible bucket (s3rver), behind a real
 * nginx running deploy/nginx.conf as its comments tell a user to run it: what a user of the OpenAI SDK
 * sees through nginx. The first replica has TRUST_PROXY naming nginx, as docs/deploy.md says; the
 * second has none, as a user who skipped it runs. The tests run in order; the last kills the replicas.
 */

const NGINX = findCommand('nginx');
if (!NGINX) console.warn('test/nginx.test.ts skipped: nginx not found (install with: apt-get install nginx-light)');

const BUCKET = 'imagegen';

let dir: string;
let root: string;
let s3: S3Service;
let nginx: NginxService;
const replicas: ServerProcess[] = [];

const client = () => new OpenAI({ baseURL: `${nginx.origin}/v1`, apiKey: OPS_KEY, maxRetries: 0 });

/** An error in OpenAI's shape: the SDK parsed its JSON (nginx's HTML page leaves `error` undefined). */
function expectOpenAiShape(err: InstanceType<typeof OpenAI.APIError>, status: number, code: string): void {
  expect({ status: err.status, code: err.code }).toEqual({ status, code });
  expect(Object.keys(err.error as object).sort()).toEqual(['code', 'message', 'param', 'type']);
}

/** Which replica answered the request whose x-request-id is `id` (its log names it a moment after). */
async function servedBy(id: string): Promise<number> {
  const which = () => replicas.findIndex((replica) => replica.log.some((line) => line.includes(`"reqId":"${id}"`)));
  await expect.poll(which).toBeGreaterThanOrEqual(0);
  return which();
}

/** Jobs running and waiting on a replica. */
async function queueOf(replica: ServerProcess): Promise<number> {
  const { queue } = (await (await fetch(`${replica.origin}/health`)).json()) as { queue: { running: number; queued: number } };
  return queue.running + queue.queued;
}

describe.skipIf(!NGINX)(`replicas behind nginx (deploy/nginx.conf)${NGINX ? '' : ' (skipped: nginx not found, install with apt-get install nginx-light)'}`, () => {
  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-nginx-'));
    root = await makeRoot();
    await mkdir(path.join(dir, 's3'));
    s3 = await startS3Server(path.join(dir, 's3'), BUCKET);
    const started = await Promise.all(
      ['a', 'b'].map((name, i) =>
        spawnServer({
          ...rootEnv(root),
          DATA_DIR: path.join(root, `data-${name}`),
          PORT: '0',
          STORE: 's3',
          S3_BUCKET: BUCKET,
          S3_ENDPOINT: s3.endpoint,
          S3_FORCE_PATH_STYLE: 'true',
          ...s3.credentials,
          // nginx's address, as docs/deploy.md and deploy/nginx.conf say; the second replica trusts no proxy.
          ...(i === 0 && { TRUST_PROXY: '127.0.0.1' }),
        }),
      ),
    );
    replicas.push(...started);
    await Promise.all(replicas.map((replica) => untilReady(replica.origin, 60_000)));
    nginx = await startNginx(NGINX!, dir, replicas.map((replica) => new URL(replica.origin).host) as [string, string]);
  }, 90_000);

  afterAll(async () => {
    await nginx?.stop();
    for (const replica of replicas) await killServer(replica);
    await s3?.stop();
    await Promise.all([dir && rm(dir, { recursive: true, force: true }), root && rm(root, { recursive: true, force: true })]);
  });

  it("names nginx's host and port in image URLs, with TRUST_PROXY or without, which load through it from either replica", async () => {
    const urls: string[] = [];
    const makers = new Set<number>();
    // nginx's least_conn takes turns between idle replicas: until each made one, the one with TRUST_PROXY
    // and the one without.
    while (makers.size < 2) {
      expect(urls.length, 'nginx sent four generations in a row to the same replica').toBeLessThan(4);
      const id = `nginx-url-${urls.length}`;
      const { data } = await client().images.generate({ model: MODEL, prompt: 'a blue square', size: '128x128' as '256x256', steps: 2, response_format: 'url' } as OpenAI.ImageGenerateParamsNonStreaming, { headers: { 'x-request-id': id } });
      urls.push(data![0].url!);
      makers.add(await servedBy(id));
    }
    for (const url of urls) {
      expect(url.startsWith(`${nginx.origin}/v1/images/files/`)).toBe(true);
      const bodies = await Promise.all([url, ...replicas.map((replica) => `${replica.origin}${new URL(url).pathname}`)].map(async (address) => Buffer.from(await (await fetch(address)).arrayBuffer())));
      expect((await sharp(bodies[0]).metadata()).width).toBe(128);
      for (const body of bodies) expect(body.equals(bodies[0])).toBe(true);
    }
  });

  // nginx.conf's maps give the replica nginx's own address as the Host (an IPv6 one in brackets: checked
  // by hand, as this nginx listens on IPv4 only, which every CI machine has).
  it("names the address nginx was reached on in image URLs for an HTTP/1.0 client that sends no Host", async () => {
    const body = JSON.stringify({ model: MODEL, prompt: 'a blue square', size: '128x128', steps: 2, response_format: 'url' });
    const { port } = new URL(nginx.origin);
    const answer = await postWithoutHost(Number(port), '/v1/images/generations', `Bearer ${OPS_KEY}`, body);
    expect(answer.status).toMatch(/^HTTP\/1\.1 200 /);
    const { data } = JSON.parse(answer.body) as OpenAI.ImagesResponse;
    expect(data![0].url!.startsWith(`${nginx.origin}/v1/images/files/`)).toBe(true);
  });

  it('passes each streamed event on whole as the replica writes it, not with the next one', async () => {
    const workers = [...(await workerProcesses(replicas[0])), ...(await workerProcesses(replicas[1]))];
    const res = await fetch(`${nginx.origin}/v1/images/generations`, {
      method: 'POST',
      headers: { authorization: `Bearer ${OPS_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'a red circle', size: '256x256', steps: 40, stream: true, partial_images: 2 }),
    });
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    let text = '';
    let resume: (() => void) | undefined;
    const reading = (async () => {
      for await (const chunk of res.body!.pipeThrough(new TextDecoderStream())) {
        text += chunk;
        // The replica writes an event in one piece: once its first line is here, all of it left the
        // replica. The workers are held there, so that no later event comes to push it out of a buffer.
        if (!resume && text.includes('event: image_generation.partial_image\n')) resume = holdProcesses(workers);
      }
    })();
    try {
      await expect.poll(() => resume).toBeDefined();
      // nginx buffering the response (proxy_buffering on) passed the event's first line and held the rest
      // until the next event came.
      await expect.poll(() => text, { timeout: 5000 }).toMatch(/^event: image_generation\.partial_image\ndata: \{.*\}\n\n/m);
    } finally {
      resume?.();
    }
    await reading;
    const types = [...text.matchAll(/^data: (.*)$/gm)].map(([, data]) => (JSON.parse(data) as { type: string }).type);
    expect(types).toEqual(['image_generation.partial_image', 'image_generation.partial_image', 'image_generation.completed']);
  });

  it("answers bodies too large in OpenAI's shape, the replica's and nginx's own, and keeps both replicas in service", async () => {
    // Over the replica's BODY_LIMIT (1 MiB): its 413 came to nginx with the connection closed under the
    // upload, which nginx turned into its HTML 502, taking the replica out for 10 s (max_fails=1).
    for (let i = 0; i < 2; i++) {
      const err = await apiError(client().images.generate({ model: MODEL, prompt: 'x'.repeat(20 * 1024 ** 2) }));
      expectOpenAiShape(err, 413, 'request_too_large');
      expect(err.message).toMatch(/the limit is 1048576 bytes/);
    }
    // A file just over the replica's limit (OpenAI's 50 MB) passes nginx: the replica's 413 names it.
    const large = await toFile(Buffer.alloc(50 * 1024 ** 2 + 1), 'large.png', { type: 'image/png' });
    const overFile = await apiError(client().images.edit({ model: MODEL, prompt: 'x', image: large }));
    expectOpenAiShape(overFile, 413, 'request_too_large');
    expect([overFile.param, overFile.message]).toEqual(['image', expect.stringContaining("An uploaded file ('image') is too large: the limit is 50 MiB per file.")]);
    // A body declared over nginx's client_max_body_size (128m, above an edit's largest form): nginx
    // answers itself, before any of it is sent.
    const declared = await announcedForm(`${nginx.origin}/v1/images/edits`, `Bearer ${OPS_KEY}`, 129 * 1024 ** 2);
    expect(declared.status).toBe(413);
    const { error } = JSON.parse(declared.body) as ErrorBody;
    expect(Object.keys(error).sort()).toEqual(['code', 'message', 'param', 'type']);
    expect(error).toMatchObject({ code: 'request_too_large', message: expect.stringContaining('nginx client_max_body_size') });
    // Neither replica rests: nginx's turns give each one of the next two requests.
    const next = [];
    for (const id of ['nginx-after-413-0', 'nginx-after-413-1']) {
      await client().models.list({ headers: { 'x-request-id': id } });
      next.push(await servedBy(id));
    }
    expect(next.sort()).toEqual([0, 1]);
  });

  it("names the client's address in the log from nginx's X-Forwarded-For with TRUST_PROXY, and trusts no forwarded address without it", async () => {
    /** GETs /v1/models through nginx from 127.0.0.2, another loopback address than nginx's, with a forged entry in front. */
    const ask = (id: string) =>
      new Promise<number>((resolve, reject) => {
        const req = request(`${nginx.origin}/v1/models`, { localAddress: '127.0.0.2', headers: { authorization: `Bearer ${OPS_KEY}`, 'x-forwarded-for': '203.0.113.9', 'x-request-id': id } }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode!));
        });
        req.on('error', reject);
        req.end();
      });
    expect([await ask('nginx-client-0'), await ask('nginx-client-1')]).toEqual([200, 200]);
    /** The address each replica's log names for the two requests, where it took one. */
    const addresses = () =>
      replicas.map((replica) =>
        replica.log
          .map((text) => JSON.parse(text) as { reqId?: string; req?: { remoteAddress?: string } })
          .find((entry) => entry.reqId?.startsWith('nginx-client-') && entry.req)?.req?.remoteAddress,
      );
    // The lines are written as the requests come, read from the replicas' output a moment later. The
    // replica without TRUST_PROXY names nginx, as it names every client of nginx.
    await expect.poll(addresses).toEqual(['127.0.0.2', '127.0.0.1']);
  });

  it("answers in OpenAI's shape when a replica dies under a request (502) and when none is left (503); the next request goes to the other", async () => {
    // Both replicas' workers held, so the request is still running on its replica when that one is killed.
    const resume = holdProcesses([...(await workerProcesses(replicas[0])), ...(await workerProcesses(replicas[1]))]);
    let died: InstanceType<typeof OpenAI.APIError>;
    let survivor: ServerProcess;
    try {
      const running = apiError(client().images.generate({ model: MODEL, prompt: 'a green triangle', size: '128x128' as '256x256', steps: 2, response_format: 'b64_json' } as OpenAI.ImageGenerateParamsNonStreaming));
      await expect.poll(async () => (await Promise.all(replicas.map(queueOf))).join(), { interval: 20 }).toMatch(/^(1,0|0,1)$/);
      const victim = (await queueOf(replicas[0])) === 1 ? 0 : 1;
      survivor = replicas[1 - victim];
      await killServer(replicas[victim]);
      died = await running;
    } finally {
      resume();
    }
    expectOpenAiShape(died, 502, 'replica_failed');

    const { data } = await client().images.generate({ model: MODEL, prompt: 'a blue square', size: '128x128' as '256x256', steps: 2, response_format: 'b64_json' } as OpenAI.ImageGenerateParamsNonStreaming);
    expect(data).toHaveLength(1);

    await killServer(survivor);
    const none = await apiError(client().models.list());
    expectOpenAiShape(none, 503, 'no_replica_available');
    expect(none.headers?.get('retry-after')).toBe('5');
    // The body nginx wrote itself, as the SDK's APIError keeps it.
    expect((none.error as ErrorBody['error']).type).toBe('server_error');
  });
});
