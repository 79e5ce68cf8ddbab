import { readdir, rm } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { generate, makeRoot, metric, scrape, startOpsServer, untilReady } from './helpers/ops-server.js';

/**
 * The real server under concurrent load on loopback, and across restarts on one DATA_DIR: no request
 * is lost or failed while there is room, the excess beyond QUEUE_MAX gets 429 (never a 5xx, never a
 * hang), and images keep their expiry across restarts.
 */

const CLIENTS = 24;
const ROUNDS = 4;

describe('load', () => {
  it(`answers ${CLIENTS} concurrent clients, ${ROUNDS} requests each, on 2 workers, every one with its images`, async () => {
    const ops = await startOpsServer({ env: { WORKERS: '2', QUEUE_MAX: '64' } });
    try {
      await untilReady(ops.server.url);
      const clients = Array.from({ length: CLIENTS }, async (_, client) => {
        for (let round = 0; round < ROUNDS; round++) {
          // Two sizes, three step counts, one or two images: several merged batches on both workers.
          const i = client + round;
          const ask = { size: i % 2 ? '128x128' : '256x256', steps: 2 + (i % 3), n: 1 + (i % 2), seed: i };
          const answer = await generate(ops.baseURL, ask);
          expect([answer.status, answer.body.data?.length]).toEqual([200, ask.n]);
        }
      });
      await Promise.all(clients);
      const text = await scrape(ops.server.url);
      expect(metric(text, 'imagegen_http_requests_total{method="POST",route="/v1/images/generations",status="200"}')).toBe(CLIENTS * ROUNDS);
      expect(metric(text, 'imagegen_queue_jobs{state="running"}')).toBe(0);
    } finally {
      await ops.close();
    }
  });

  it('answers the excess over QUEUE_MAX with 429 and Retry-After only, never a 5xx or a hang', async () => {
    const ops = await startOpsServer({ env: { QUEUE_MAX: '2' } });
    try {
      await untilReady(ops.server.url);
      // Distinct step counts: none can join another's batch, each needs a place in the queue.
      const answers = await Promise.all(Array.from({ length: CLIENTS }, (_, i) => generate(ops.baseURL, { steps: 10 + i })));
      const served = answers.filter((a) => a.status === 200);
      const refused = answers.filter((a) => a.status === 429);
      expect(served.length + refused.length).toBe(CLIENTS);
      // One running and two waiting at least; the rest arrived while those were there.
      expect(served.length).toBeGreaterThanOrEqual(3);
      expect(refused.length).toBeGreaterThanOrEqual(CLIENTS / 2);
      for (const answer of refused) {
        expect(answer.body.error).toMatchObject({ type: 'requests', code: 'rate_limit_exceeded' });
        expect(Number(answer.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      }
    } finally {
      await ops.close();
    }
  });
});

describe('restarts', () => {
  it('keep unexpired images with their own expiry and forget expired ones', async () => {
    const root = await makeRoot();
    try {
      /** The path of one stored image made by a server that lives only for it. */
      const storeOne = async (ttlSeconds: string) => {
        const ops = await startOpsServer({ root, env: { IMAGE_TTL_SECONDS: ttlSeconds } });
        try {
          const answer = await generate(ops.baseURL, { response_format: 'url' });
          expect(answer.status).toBe(200);
          return new URL(answer.body.data![0].url!).pathname;
        } finally {
          await ops.close();
        }
      };
      const shortLived = await storeOne('1');
      const longLived = await storeOne('3600');

      // The server that restarts lives a minute later (its store's clock), so the short-lived image expired.
      const ops = await startOpsServer({ root, clock: () => Date.now() + 60_000 });
      try {
        const gone = await fetch(`${ops.server.url}${shortLived}`);
        expect(gone.status).toBe(404);
        expect((await gone.json()).error).toMatchObject({ code: 'image_not_found', param: null });

        const kept = await fetch(`${ops.server.url}${longLived}`);
        expect(kept.status).toBe(200);
        expect(kept.headers.get('content-type')).toBe('image/png');
        // Its own hour, not this server's default day.
        const maxAge = Number(/max-age=(\d+)/.exec(kept.headers.get('cache-control')!)![1]);
        expect(maxAge).toBeGreaterThan(3500);
        expect(maxAge).toBeLessThanOrEqual(3600);

        const files = await readdir(path.join(root, 'data', 'images'));
        // Its id, expiry, size and digest, and its owner: the ops key's id (image-names.ts).
        expect(files).toEqual([expect.stringMatching(new RegExp(`^${path.basename(longLived, '.png')}\\.\\d+\\.\\d+\\.[0-9a-f]{16}\\.k[0-9a-f]{16}\\.png$`))]);
      } finally {
        await ops.close();
      }
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
