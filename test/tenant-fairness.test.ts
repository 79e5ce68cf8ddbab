import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { holdBusyWorker, holdNextBatch } from './helpers/busy-worker.js';
import { capturedLogs } from './helpers/logs.js';
import { startRealServer, type RealServer } from './helpers/real-server.js';

/**
 * One server shared by several API keys: what one key queues, however much, leaves the others a way
 * in. A real server with one worker and the embedded demo model; the key that floods holds its
 * running batch (SIGSTOP) while the others ask.
 */

const FLOOD = 'sk-flood-0123456789';
const OTHER = 'sk-other-0123456789';

describe('QUEUE_MAX_SECONDS held by one key', () => {
  let real: RealServer;
  beforeAll(async () => {
    // One second of estimated work may wait per worker: one large request of the flooding key fills it.
    real = await startRealServer({ apiKey: `${FLOOD},${OTHER}`, env: { WORKERS: '1', QUEUE_MAX_SECONDS: '1' } });
  });
  afterAll(() => real?.close());

  const post = (key: string, body: object, signal?: AbortSignal) =>
    fetch(`${real.server.url}/v1/images/generations`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'demo-shapes', prompt: 'a red circle', response_format: 'b64_json', ...body }),
      signal,
    });

  it("admits another key's request while one key's queued work is over the bound, and goes on refusing that key's own", async () => {
    const engine = real.server.engine;
    const flood = new AbortController();
    let resume = () => {};
    try {
      await expect.poll(() => engine.readiness().ready, { timeout: 60_000 }).toBe(true);
      // Cancelled with the flood once the other key's request is in: the worker stops at its next step,
      // where it ran all 150 steps before the other's could.
      const running = post(FLOOD, { size: '1024x1024', steps: 150 }, flood.signal).catch(() => undefined);
      await expect.poll(() => engine.load().running).toBe(1);
      resume = await holdBusyWorker(engine);
      // Ten 1024x1024 images of 150 steps: far more than a second of estimated work, at any speed.
      const queued = post(FLOOD, { size: '1024x1024', steps: 149, n: 10 }, flood.signal).catch(() => undefined);
      // In batches of the model's batch limit, admitted together.
      await expect.poll(() => engine.load().queued).toBeGreaterThan(0);
      const flooding = engine.load().queued;
      // The flooding key's next request is refused: its own queued work is over the bound.
      const again = await post(FLOOD, { size: '256x256', steps: 2 });
      expect(again.status).toBe(429);

      // The other key has nothing waiting: it gets in (it was told to retry in a minute, for the flood's work).
      const other = new OpenAI({ baseURL: real.baseURL, apiKey: OTHER, maxRetries: 0 });
      const answer = other.images.generate({ model: 'demo-shapes', prompt: 'a blue square', size: '256x256', response_format: 'b64_json' });
      const settled = answer.then(
        () => 'answered',
        (err: unknown) => err,
      );
      await expect.poll(async () => (engine.load().queued === flooding + 1 ? 'queued' : await Promise.race([settled, 'pending']))).toBe('queued');
      flood.abort();
      resume();
      expect(await settled).toBe('answered');
      await running;
      await queued;
    } finally {
      flood.abort();
      resume();
    }
  });
});

describe("requests merged into another key's batch", () => {
  // Keys: X (or H) holds the one worker with a long batch while the others line up behind it. The fair
  // order remembers what each key was served: each test has keys of its own (`keys`), on one server, where
  // a server each started three (and loaded the model three times). A key first seen starts where the
  // last chosen one was (fair-order.ts), as every key of a fresh server starts at nothing.
  const KEYS = [1, 2, 3].map((test) => ['holder', 'heavy', 'light'].map((role) => `sk-${role}${test}-0123456789`));
  const keys = (test: number) => KEYS[test - 1];
  let real: RealServer;
  const logs = capturedLogs<{ msg: string }>();
  beforeAll(async () => {
    real = await startRealServer({ apiKey: KEYS.flat().join(','), env: { WORKERS: '1' }, logger: logs.logger });
  });
  afterAll(() => real?.close());

  /**
   * Sends a streamed 256x256 request of `key` and answers once it waits in the queue (a streamed
   * request's first line says so), with what ends once its images came, logging `name` in `order` then;
   * `steps` tells batches apart (only equal settings merge).
   */
  async function send(order: string[], name: string, key: string, steps: number, n = 1): Promise<{ done: Promise<void> }> {
    const res = await fetch(`${real.server.url}/v1/images/generations`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256', steps, n, stream: true }),
    });
    expect(res.status).toBe(200);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    expect((await reader.read()).value).toBe(': queued\n\n');
    const done = (async () => {
      let text = '';
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += chunk.value;
      expect(text.match(/^event: image_generation\.completed$/gm)).toHaveLength(n);
      order.push(name);
    })();
    return { done };
  }

  /**
   * Runs `lineUp` while a batch of `holder`'s holds the worker (held before it begins: see holdNextBatch);
   * answers when all it sent is done. Its 1024x1024 charges `holder` far more than any request lined up
   * (256x256, a few steps); 10 steps, run once it is let go: 150 took most of the file's time.
   */
  async function behindHeldBatch(holder: string, lineUp: () => Promise<{ done: Promise<void> }[]>): Promise<void> {
    const engine = real.server.engine;
    await expect.poll(() => engine.readiness().ready, { timeout: 60_000 }).toBe(true);
    const { sent: held, resume } = await holdNextBatch(engine, () =>
      fetch(`${real.server.url}/v1/images/generations`, {
        method: 'POST',
        headers: { authorization: `Bearer ${holder}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'demo-shapes', prompt: 'a red circle', size: '1024x1024', steps: 10, response_format: 'b64_json' }),
      }),
    );
    expect(engine.load().running).toBe(1);
    try {
      const sent = await lineUp();
      resume();
      await Promise.all([held, ...sent.map((s) => s.done)]);
    } finally {
      resume();
    }
  }

  it("keep their key's order: a key with a batch waiting does not jump it by joining another key's", async () => {
    const [, H, L] = keys(1);
    const order: string[] = [];
    // H's long batch runs: H has been served more than L, whose batches go first.
    await behindHeldBatch(H, async () => [
      // H's first request fills a batch of its own (the model's batch limit is 4); L's opens one with room.
      await send(order, 'H first', H, 2, 4),
      await send(order, 'L', L, 2),
      // H's second would have fitted L's batch, next in L's line, ahead of H's first.
      await send(order, 'H second', H, 2),
    ]);
    expect(order.indexOf('H first')).toBeLessThan(order.indexOf('H second'));
  });

  it("charge each key for its own images: one riding in another key's batch does not push that key's next request behind its own", async () => {
    const [X, H, L] = keys(2);
    const order: string[] = [];
    await behindHeldBatch(X, async () => [
      // L's batch of one image, which H, with nothing waiting, joins with three.
      await send(order, 'L first', L, 2),
      await send(order, 'H riding', H, 2, 3),
      // Then one more each, of other settings: a batch each, after L's first.
      await send(order, 'L next', L, 3),
      await send(order, 'H next', H, 4),
    ]);
    // L's first batch ran a quarter of its images for L, three quarters for H: L is served next.
    expect(order.slice(0, 2).sort()).toEqual(['H riding', 'L first']);
    expect(order.slice(2)).toEqual(['L next', 'H next']);
  });

  it("give a key back the work of a request it cancelled while it ran: its next request does not wait behind another key's queue for it", async () => {
    const [, H, L] = keys(3);
    const engine = real.server.engine;
    await expect.poll(() => engine.readiness().ready, { timeout: 60_000 }).toBe(true);
    const order: string[] = [];
    const cancel = new AbortController();
    // H's long batch starts at once, and H is charged for all of it: far more than L's three below.
    const cancelled = fetch(`${real.server.url}/v1/images/generations`, {
      method: 'POST',
      headers: { authorization: `Bearer ${H}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'demo-shapes', prompt: 'a red circle', size: '1024x1024', steps: 150, response_format: 'b64_json' }),
      signal: cancel.signal,
    }).catch(() => undefined);
    await expect.poll(() => engine.load().running).toBe(1);
    const resume = await holdBusyWorker(engine);
    try {
      const sent = [await send(order, 'L 1', L, 100), await send(order, 'L 2', L, 101), await send(order, 'L 3', L, 102)];
      // H cancels a step or so into its batch (the worker stops at its next step), and asks for something else.
      const logged = logs.lines.length;
      cancel.abort();
      await expect.poll(() => logs.lines.slice(logged).map((line) => line.msg)).toContain('request aborted: the client closed the connection before the answer was sent');
      sent.push(await send(order, 'H next', H, 103));
      resume();
      await Promise.all([cancelled, ...sent.map((s) => s.done)]);
    } finally {
      resume();
    }
    // Served next, or after one of L's; before, H was held to the work it cancelled, and went after all of L's.
    expect(order.indexOf('H next')).toBeLessThan(2);
  });
});
