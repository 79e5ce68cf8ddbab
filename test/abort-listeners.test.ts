import { getEventListeners } from 'node:events';
import type { ImageGenerateParamsNonStreaming } from 'openai/resources/images';
import { describe, expect, it } from 'vitest';
import { BatchMerger, type BatchRunner } from '../src/engine/batcher.js';
import { JobQueue, QueueFullError } from '../src/engine/job-queue.js';
import type { GenerationBatch } from '../src/runtime/types.js';
import { referenceModel } from './helpers/reference.js';
import { startRealServer } from './helpers/real-server.js';

/**
 * Every abort listener the engine adds to a request's signal is gone once the request settled. The
 * service hands the engine an AbortSignal.any() signal, and Node keeps such a signal alive while it has
 * an abort listener: one left behind kept each response's images reachable for ever (the server grew by
 * about 156 KiB per request). `npm run bench:soak` measures the memory itself; this pins the cause.
 */

const batch = (seed: number, n = 1): GenerationBatch => ({
  modelDir: '/models/demo',
  width: 64,
  height: 64,
  steps: 1,
  guidanceScale: 0,
  items: Array.from({ length: n }, (_, i) => ({ prompt: 'a red circle', negativePrompt: '', seed: seed + i })),
});

const drawn: BatchRunner = async (b) => b.items.map((item) => ({ data: new Uint8Array(8), contentType: 'image/png', seed: item.seed }));

/** A request's signal as the service makes it: its lifetime and its sibling batches' failure. */
function requestSignal(): { signal: AbortSignal; cancel(): void } {
  const lifetime = new AbortController();
  return { signal: AbortSignal.any([lifetime.signal, new AbortController().signal]), cancel: () => lifetime.abort(new Error('client left')) };
}

const listeners = (signals: AbortSignal[]) => signals.map((s) => getEventListeners(s, 'abort').length);

/** `count` requests on a one-worker queue, so most wait and merge, as under load. */
async function settleAll(runner: BatchRunner, count: number, queueMax = 100, cancelled = new Set<number>()) {
  const queue = new JobQueue(1, queueMax);
  const merger = new BatchMerger(queue, runner, 4);
  const requests = Array.from({ length: count }, requestSignal);
  const outcomes = Promise.allSettled(requests.map(({ signal }, i) => merger.generate(batch(i, 1 + (i % 3)), signal)));
  for (const i of cancelled) requests[i].cancel();
  return { results: await outcomes, signals: requests.map((r) => r.signal) };
}

describe('abort listeners on request signals', () => {
  it('are all removed once requests succeed', async () => {
    const { results, signals } = await settleAll(drawn, 50);
    expect(results.every((r) => r.status === 'fulfilled')).toBe(true);
    expect(listeners(signals)).toEqual(signals.map(() => 0));
  });

  it('are all removed once requests fail', async () => {
    const { results, signals } = await settleAll(() => Promise.reject(new Error('worker failed')), 20);
    expect(results.every((r) => r.status === 'rejected')).toBe(true);
    expect(listeners(signals)).toEqual(signals.map(() => 0));
  });

  it('are all removed when some requests are cancelled and the others complete', async () => {
    const { results, signals } = await settleAll(drawn, 20, 100, new Set([3, 4, 11]));
    expect(results.map((r) => r.status === 'rejected')).toEqual(signals.map((_, i) => [3, 4, 11].includes(i)));
    expect(listeners(signals)).toEqual(signals.map(() => 0));
  });

  it('are all removed when the queue turns requests away', async () => {
    // Each batch of 4 fills a group of its own, so the second group waits and the third is refused.
    const queue = new JobQueue(1, 1);
    const merger = new BatchMerger(queue, drawn, 4);
    const requests = Array.from({ length: 3 }, requestSignal);
    const results = await Promise.allSettled(requests.map(({ signal }, i) => merger.generate(batch(10 * i, 4), signal)));
    expect(results.map((r) => (r.status === 'rejected' ? r.reason : 'ok'))).toEqual(['ok', 'ok', expect.any(QueueFullError)]);
    expect(listeners(requests.map((r) => r.signal))).toEqual([0, 0, 0]);
  });
});

describe("a request's signal in the whole server", () => {
  it('takes the listeners of n batches without a "possible memory leak" warning', async () => {
    // max_batch 1, as FLUX's preset has: n = 10 is ten batches waiting on the one request signal, each
    // with its own listeners, more than Node's default of 10 (which then warned on stderr, a false alarm).
    const single = { copy: referenceModel('sd-turbo'), preset: { sizes: ['64x64'], default_size: '64x64', max_batch: 1 } };
    const real = await startRealServer({ models: { single }, env: { WORKERS: '1' } });
    const warnings: string[] = [];
    const onWarning = (warning: Error) => void warnings.push(`${warning.name}: ${warning.message}`);
    process.on('warning', onWarning);
    try {
      const params = { model: 'single', prompt: 'a red circle', n: 10, response_format: 'b64_json', steps: 1 };
      const { data } = await real.client.images.generate(params as ImageGenerateParamsNonStreaming);
      expect(data).toHaveLength(10);
      // Warnings are emitted on the next tick.
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings).toEqual([]);
    } finally {
      process.off('warning', onWarning);
      await real.close();
    }
  }, 60_000);
});
