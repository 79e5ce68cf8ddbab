import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEMO_MODEL_DIR } from './helpers/demo-model.js';
import type { ModelMemory } from '../src/models/memory-figures.js';
import { metric } from './helpers/ops-server.js';
import { startRealServer, type RealServer } from './helpers/real-server.js';

/**
 * Two worker processes planning against the same memory (src/engine/memory-arbiter.ts): a batch that
 * fits the machine alone but not beside another's waits for it to end, rather than both counting on
 * the same free bytes; and waiting is not taken for a stalled worker.
 */

const MiB = 2 ** 20;
// What the demo model is said to need (the file of figures a server keeps in DATA_DIR): 600 MiB to
// denoise one 512x512 image. MEMORY_LIMIT 1g gives 921.6 MiB to plan with: room for one such image
// at a time, not two (a batch of three runs one image after the other, holding its 600 MiB throughout).
const FIGURES: Record<string, ModelMemory> = {
  [DEMO_MODEL_DIR]: { weightsBytes: MiB, peakBytes: 600 * MiB, peakPixels: 512 * 512, denoise: [{ pixels: 512 * 512, bytes: 600 * MiB }] },
};

describe('memory shared out among the workers', () => {
  let real: RealServer;
  let root: string;
  beforeAll(async () => {
    root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-memory-pool-'));
    await mkdir(path.join(root, 'data'), { recursive: true });
    await writeFile(path.join(root, 'data', 'model-memory.json'), JSON.stringify(FIGURES));
    // A stall timeout shorter than the first batch: the waiting worker makes no progress meanwhile.
    real = await startRealServer({ root, env: { WORKERS: '2', MEMORY_LIMIT: '1g', WORKER_STALL_TIMEOUT_SECONDS: '1', METRICS_PUBLIC: 'true', PRELOAD: 'demo-shapes' } });
    while (!real.server.engine.readiness().ready) await new Promise((resolve) => setTimeout(resolve, 50));
  });
  afterAll(async () => {
    await real?.close();
    await rm(root, { recursive: true, force: true });
  });

  const waits = async () => metric(await (await fetch(`${real.server.url}/metrics`)).text(), 'imagegen_memory_waits_total');

  it('runs two batches that fit only one at a time one after the other, both to completion', async () => {
    // Different step counts: two batches the pool cannot merge, one per worker.
    const generate = (steps: number) => {
      const started = performance.now();
      return real.client.images
        .generate({ model: 'demo-shapes', prompt: 'a red circle', size: '512x512', n: 3, response_format: 'b64_json', steps } as never)
        .then((res) => ({ images: res.data!.length, started, ended: performance.now() }));
    };
    const [first, second] = await Promise.all([generate(150), generate(149)]);
    expect([first.images, second.images]).toEqual([3, 3]);
    expect(await waits()).toBeGreaterThanOrEqual(1);
    // One waited for the other: their runs did not overlap, so the later one ended well after the earlier.
    const [earlier, later] = [first, second].sort((a, b) => a.ended - b.ended);
    expect(later.ended - earlier.ended).toBeGreaterThan(0.5 * (earlier.ended - earlier.started));
    // No worker was killed for the wait.
    expect(real.server.engine.workers().every((w) => w.alive)).toBe(true);
  });
});
