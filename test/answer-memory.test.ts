import { existsSync, readFileSync } from 'node:fs';
import type net from 'node:net';
import path from 'node:path';
import OpenAI from 'openai';
import sharp from 'sharp';
import { describe, expect, it } from 'vitest';
import { startTestServer, TEST_KEY, writeDemoModel, type TestServer } from './helpers/api-server.js';
import { metric, scrape } from './helpers/ops-server.js';
import { capturedLogs } from './helpers/logs.js';
import { unreadRequest } from './helpers/raw-http.js';

/**
 * ANSWER_MEMORY (src/http/answer-memory.ts) over HTTP: answers whose clients leave them unread hold it,
 * a key holding its share of it gets 429 before any work is done while other keys are still served, and
 * all of it comes back as the clients read, hang up or are cut by SEND_TIMEOUT_SECONDS.
 */

const MiB = 1024 ** 2;

/**
 * The answers held: the embedded model's n=6 at 1792x1024, about 5.8 MB of base64 (about 0.85 s to make on
 * one core). The kernel takes what a socket's buffers hold of an answer its client does not read (on
 * Linux by default about 4.2 MB: the server's send buffer grows to 4 MiB, the client's receive buffer
 * holds 128 KiB) and the server the rest, until the client reads it: the server counts the answer whole
 * until then. The shares below sit between a large answer and its reservation (a key's whole share):
 * n=10 (9.7 MB) with shares twice as large proved the same at 5/3 of the work.
 */
const LARGE = { model: 'large', size: '1792x1024', n: 6, response_format: 'b64_json' } as const;
/** A large answer's bytes, less some: what the server holds once one is made (or set aside, its share, while it is made). */
const LARGE_HELD = 5.5e6;
/** A streamed answer of ten such images (9.7 MB): the kernel's 4.2 MB leave a stream's events 5.5 MB to hold. */
const STREAMED = { ...LARGE, n: 10 } as const;

/** The most the kernel may take of an unread answer: Linux's largest send buffer and default receive buffer (none known elsewhere). */
function kernelTakes(): number {
  const largest = (file: string, at: number) => (existsSync(file) ? Number(readFileSync(file, 'utf8').trim().split(/\s+/)[at]) : 0);
  return largest('/proc/sys/net/ipv4/tcp_wmem', 2) + largest('/proc/sys/net/ipv4/tcp_rmem', 1);
}
/** Past this, the kernel could take a large answer whole, which then holds nothing of the server's: the tests could not hold any. */
const KERNEL_TOO_LARGE = kernelTakes() > 5 * MiB;
const SKIPPED = KERNEL_TOO_LARGE ? ` (skipped: this machine's sockets can buffer ${(kernelTakes() / MiB).toFixed(1)} MiB of an unread answer, about all of the 5.8 MB the tests leave unread)` : '';

/** Adds the large model (the demo model at 1792x1024) to a test server. */
async function withLargeModel(server: TestServer): Promise<TestServer> {
  await writeDemoModel(path.join(server.modelsDir, 'large'), { sizes: ['1792x1024'], default_size: '1792x1024' }, { canEdit: false });
  await server.registry.scan();
  return server;
}

/** A POST of `body` to `route` with `key`, as raw HTTP. */
function post(key: string, body: object, route = '/v1/images/generations'): string {
  const text = JSON.stringify(body);
  return `POST ${route} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(text)}\r\n\r\n${text}`;
}

/** The answer bytes ANSWER_MEMORY holds, as /metrics says. */
const answerBytes = async (server: TestServer, key: string) => metric(await scrape(server.origin, key), 'imagegen_answer_memory_bytes') ?? NaN;

/** Reads the rest of a chunked answer on `socket` and gives its body. */
async function readAnswer(socket: net.Socket): Promise<string> {
  let text = '';
  socket.on('data', (chunk: Buffer) => (text += chunk.toString()));
  socket.resume();
  await expect.poll(() => text.endsWith('\r\n0\r\n\r\n'), { timeout: 20_000 }).toBe(true);
  let [body, at] = ['', text.indexOf('\r\n\r\n') + 4];
  for (;;) {
    const end = text.indexOf('\r\n', at);
    const size = parseInt(text.slice(at, end), 16);
    if (!size) return body;
    body += text.slice(end + 2, end + 2 + size);
    at = end + 2 + size + 2;
  }
}

/** The size of the first image of a b64_json answer, decoded. */
async function firstImageSize(data: { b64_json?: string }[]): Promise<string> {
  const { width, height } = await sharp(Buffer.from(data[0].b64_json!, 'base64')).metadata();
  return `${width}x${height}`;
}

describe.skipIf(KERNEL_TOO_LARGE)(`answers left unread${SKIPPED}`, () => {
  it("keep their key's further requests out past its share of ANSWER_MEMORY, not other keys', and give it all back as they are read or their connections end", async () => {
    const mallory = 'sk-mallory-0123456789';
    const alice = 'sk-alice-0123456789';
    // A key's share: 5 MiB, less than one large answer (5.8 MB), which is made alone and then holds all of it.
    const server = await withLargeModel(await startTestServer({ keysFile: `mallory:${mallory}\nalice:${alice}\n`, config: { answerMemory: 10 * MiB } }));
    const port = Number(new URL(server.origin).port);
    const client = (key: string) => new OpenAI({ baseURL: server.baseURL, apiKey: key, maxRetries: 0 });
    const small = { model: 'stub', prompt: 'a red circle', size: '64x64', response_format: 'b64_json' } as const;
    const unread = [unreadRequest(port, post(mallory, { ...LARGE, prompt: 'a red circle', seed: 1 })), unreadRequest(port, post(mallory, { ...LARGE, prompt: 'a blue square', seed: 2 }))];
    // Which of the two was made (seeds 1 and 2): the server may take either first, sent at once.
    const made = () => server.engine.batches.map((batch) => batch.items[0].seed).filter((seed) => seed === 1 || seed === 2);
    try {
      // The first answer made and held (the metric says so), more than mallory's share; the other waits for room.
      await expect.poll(() => answerBytes(server, alice), { timeout: 30_000 }).toBeGreaterThan(5 * MiB);
      expect(made()).toHaveLength(1);
      const [first, other] = made()[0] === 1 ? [unread[0], unread[1]] : [unread[1], unread[0]];
      const batches = server.engine.batches.length;
      const refused = await client(mallory)
        .images.generate(small)
        .catch((err: unknown) => err);
      expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
      const error = refused as InstanceType<typeof OpenAI.RateLimitError>;
      expect(error.message).toMatch(/this API key's earlier answers .* as one key may \(5(\.0)? MiB of ANSWER_MEMORY, 10(\.0)? MiB, .*\): their clients have not read them yet, or they are still being made .*\. Read those answers/);
      expect(error.headers?.get('retry-after')).toBe('5');
      // Refused before any work was queued for it.
      expect(server.engine.batches.length).toBe(batches);
      // Another key is served meanwhile: the answers are mallory's, not all the server may hold.
      const served = await client(alice).images.generate(small);
      expect(await firstImageSize(served.data!)).toBe('64x64');

      // Mallory reads the first answer (whole, though it waited): its bytes go back, and the other is made with them.
      const answer = JSON.parse(await readAnswer(first)) as { data: { b64_json?: string }[] };
      expect(answer.data).toHaveLength(6);
      expect(await firstImageSize(answer.data)).toBe('1792x1024');
      await expect.poll(() => made().length, { timeout: 10_000 }).toBe(2);
      await expect.poll(() => answerBytes(server, alice), { timeout: 30_000 }).toBeGreaterThan(5 * MiB);
      // Its client hangs up (a reset): nothing is left held, and mallory is served again.
      other.resetAndDestroy();
      await expect.poll(() => answerBytes(server, alice), { timeout: 10_000 }).toBe(0);
      expect(await firstImageSize((await client(mallory).images.generate(small)).data!)).toBe('64x64');
    } finally {
      for (const socket of unread) socket.destroy();
      await server.close();
    }
  }, 60_000);

  it('are not made past ANSWER_MEMORY by requests admitted together: each sets its most aside first, and a later one waits for the room an earlier one gives back', async () => {
    // One client (a server without keys), its share 6 MiB: one large answer (5.8 MB) fits it, two do not.
    const server = await withLargeModel(await startTestServer({ config: { answerMemory: 12 * MiB } }));
    const port = Number(new URL(server.origin).port);
    const share = 6 * MiB;
    // Admitted together, while nothing is held yet: before, each was let in and their three answers held 29 MB of 24 MiB at n=10.
    const unread = [100, 200, 300].map((seed) => unreadRequest(port, post(TEST_KEY, { ...LARGE, prompt: 'a red circle', seed })));
    // The requests whose work began (seeds 100.., 200.., 300..).
    const made = () => new Set(server.engine.batches.map((batch) => Math.floor(batch.items[0].seed / 100))).size;
    let most = 0;
    const held = async () => {
      const bytes = await answerBytes(server, TEST_KEY);
      most = Math.max(most, bytes);
      return bytes;
    };
    try {
      for (const [i, socket] of unread.entries()) {
        // One answer made and held at a time: the next request's work waits until it is read.
        await expect.poll(held, { timeout: 30_000 }).toBeGreaterThan(LARGE_HELD);
        await expect.poll(held, { timeout: 30_000 }).toBeLessThanOrEqual(share);
        await new Promise((resolve) => setTimeout(resolve, 1500));
        expect(await held()).toBeLessThanOrEqual(share);
        expect(made()).toBe(i + 1);
        const answer = JSON.parse(await readAnswer(socket)) as { data: { b64_json?: string }[] };
        expect(answer.data).toHaveLength(6);
        expect(await firstImageSize(answer.data)).toBe('1792x1024');
      }
      await expect.poll(held, { timeout: 10_000 }).toBe(0);
      expect(most).toBeLessThanOrEqual(share);
    } finally {
      for (const socket of unread) socket.destroy();
      await server.close();
    }
  }, 120_000);

  it("count the user (or safety_identifier) a gpt-image answer repeats: three tiny answers with a long one are not made at once past ANSWER_MEMORY", async () => {
    // A share of 6 MiB; each answer repeats its 5 MB user (as safety_identifier) beside a 64x64 image.
    // Before, each set aside and held only its image (about 30 kB): all three were made at once, and
    // their unread answers held 15 MB the budget never counted.
    const server = await startTestServer({ aliases: { 'gpt-image-1': 'stub' }, config: { answerMemory: 12 * MiB, bodyLimit: 6 * MiB } });
    const port = Number(new URL(server.origin).port);
    const user = 'u'.repeat(5e6);
    const unread = [100, 200, 300].map((seed) => unreadRequest(port, post(TEST_KEY, { model: 'gpt-image-1', prompt: 'a red circle', user, seed })));
    const made = () => new Set(server.engine.batches.map((batch) => Math.floor(batch.items[0].seed / 100))).size;
    try {
      await expect.poll(() => answerBytes(server, TEST_KEY), { timeout: 30_000 }).toBeGreaterThan(5e6);
      await new Promise((resolve) => setTimeout(resolve, 1500));
      // One such answer fits in the share, not two: the others wait for its room.
      expect(made()).toBe(1);
      expect(await answerBytes(server, TEST_KEY)).toBeLessThanOrEqual(6 * MiB);
      // Read, each gives the room back to the next.
      for (const socket of unread) expect((JSON.parse(await readAnswer(socket)) as { safety_identifier: string }).safety_identifier).toBe(user);
      expect(made()).toBe(3);
      await expect.poll(() => answerBytes(server, TEST_KEY), { timeout: 10_000 }).toBe(0);
    } finally {
      for (const socket of unread) socket.destroy();
      await server.close();
    }
  }, 60_000);

  it('take the room given back in the order their requests came: a small request waits behind a large one that waits, rather than pass it', async () => {
    // One client (a server without keys), its share 6 MiB: an unread large answer (5.8 MB) leaves
    // room for a small answer, but not for another large one's most (its whole share).
    const server = await withLargeModel(await startTestServer({ config: { answerMemory: 12 * MiB } }));
    const port = Number(new URL(server.origin).port);
    const unread = [unreadRequest(port, post(TEST_KEY, { ...LARGE, prompt: 'a red circle', seed: 1 }))];
    const madeAt = (seed: number) => server.engine.batches.findIndex((batch) => batch.items[0].seed === seed);
    try {
      await expect.poll(() => answerBytes(server, TEST_KEY), { timeout: 30_000 }).toBeGreaterThan(LARGE_HELD);
      unread.push(unreadRequest(port, post(TEST_KEY, { ...LARGE, prompt: 'a blue square', seed: 2 })));
      await new Promise((resolve) => setTimeout(resolve, 1000));
      expect(madeAt(2)).toBe(-1);
      // It would fit beside the unread answer, but the large one waits before it. Before, it went at once,
      // and a steady flow of such requests kept the large one waiting until its 429.
      const small = server.client.images.generate({ model: 'stub', prompt: 'a red circle', size: '64x64', response_format: 'b64_json', seed: 3 } as OpenAI.ImageGenerateParamsNonStreaming);
      await new Promise((resolve) => setTimeout(resolve, 1500));
      expect(madeAt(3)).toBe(-1);
      const first = JSON.parse(await readAnswer(unread[0])) as { data: unknown[] };
      expect(first.data).toHaveLength(6);
      expect(await firstImageSize((await small).data!)).toBe('64x64');
      expect(madeAt(2)).toBeGreaterThanOrEqual(0);
      expect(madeAt(2)).toBeLessThan(madeAt(3));
    } finally {
      for (const socket of unread) socket.destroy();
      await server.close();
    }
  }, 60_000);

  it('wait for room at most QUEUE_TIMEOUT_SECONDS, then get the 429 (a stream as its error event)', async () => {
    // A share of 6 MiB: one unread large answer (5.8 MB) leaves room, though not for another one's most.
    const server = await withLargeModel(await startTestServer({ config: { answerMemory: 12 * MiB, queueTimeoutSeconds: 2 } }));
    const port = Number(new URL(server.origin).port);
    const unread = unreadRequest(port, post(TEST_KEY, { ...LARGE, prompt: 'a red circle', seed: 1 }));
    try {
      await expect.poll(() => answerBytes(server, TEST_KEY), { timeout: 30_000 }).toBeGreaterThan(LARGE_HELD);
      const batches = server.engine.batches.length;
      const started = performance.now();
      // The server collects its garbage while they wait, as a busy one does (its answers are megabytes):
      // the wait's deadline still ends it. Before, it was collected with it, and they waited for good.
      const collecting = setInterval(() => globalThis.gc!(), 100);
      // The client gives up long after the deadline: a wait that does not end fails the test, not its timeout.
      const gaveUp = { signal: AbortSignal.timeout(15_000) };
      const [plain, streamed] = await Promise.all([
        server.client.images.generate({ ...LARGE, prompt: 'a blue square' }, gaveUp).catch((err: unknown) => err),
        (async () => {
          const events = await server.client.images.generate({ ...LARGE, prompt: 'a blue square', stream: true }, gaveUp);
          for await (const event of events) expect(event.type).toBe('never');
        })().catch((err: unknown) => err),
      ]).finally(() => clearInterval(collecting));
      expect(performance.now() - started).toBeGreaterThanOrEqual(1900);
      expect(plain).toBeInstanceOf(OpenAI.RateLimitError);
      expect((plain as Error).message).toMatch(/^429 Rate limit reached \(waited [23]s for room\): this API key's earlier answers .* still being made .*\. Read those answers/);
      // The stream had begun (it waited in the queue): the refusal is its error event.
      expect(streamed).toBeInstanceOf(OpenAI.APIError);
      expect((streamed as Error).message).toMatch(/Rate limit reached \(waited [23]s for room\): .*ANSWER_MEMORY/);
      // Neither was made, and the room they waited for is as the unread answer left it.
      expect(server.engine.batches.length).toBe(batches);
      expect(await answerBytes(server, TEST_KEY)).toBeLessThanOrEqual(6 * MiB);
    } finally {
      unread.destroy();
      await server.close();
    }
  }, 60_000);

  it('held by a stream whose client stops reading come back once SEND_TIMEOUT_SECONDS cut it, and its key is served again', async () => {
    const logs = capturedLogs<{ msg: string }>();
    // A share of 2 MiB, less than what the kernel leaves of a stream's ten images (STREAMED).
    const server = await withLargeModel(await startTestServer({ config: { answerMemory: 4 * MiB, sendTimeoutSeconds: 3, sendMinRate: 0 }, logger: logs.logger }));
    const port = Number(new URL(server.origin).port);
    const stalled = unreadRequest(port, post(TEST_KEY, { ...STREAMED, prompt: 'a red circle', stream: true }));
    const small = { model: 'stub', prompt: 'a red circle', size: '64x64', response_format: 'b64_json' } as const;
    try {
      await expect.poll(() => answerBytes(server, TEST_KEY), { timeout: 30_000 }).toBeGreaterThan(2 * MiB);
      const refused = await server.client.images.generate(small).catch((err: unknown) => err);
      expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
      // Cut once it took none of the stream for SEND_TIMEOUT_SECONDS: every byte of it goes back.
      await expect.poll(() => logs.lines.map((line) => line.msg), { timeout: 20_000 }).toContain('the client took none of its answer for SEND_TIMEOUT_SECONDS: connection closed');
      await expect.poll(() => answerBytes(server, TEST_KEY), { timeout: 10_000 }).toBe(0);
      expect(await firstImageSize((await server.client.images.generate(small)).data!)).toBe('64x64');
    } finally {
      stalled.destroy();
      await server.close();
    }
  }, 60_000);
});
