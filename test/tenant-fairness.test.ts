import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { holdBusyWorker } from './helpers/busy-worker.js';
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
      const running = post(FLOOD, { size: '1024x1024', steps: 150 }).catch(() => undefined);
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
