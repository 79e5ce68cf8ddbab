import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ApiError } from '../src/api/errors.js';
import { QueueTimeoutError } from '../src/engine/job-queue.js';
import { WorkerDiedError, WorkerProcess } from '../src/engine/worker-process.js';
import type { WorkerInit } from '../src/engine/worker-protocol.js';
import type { GenerationBatch } from '../src/runtime/types.js';
import { engineError } from '../src/service/failures.js';

/** The engine's failures as clients read them: the advice has to fit the cause. */
describe('engineError', () => {
  it('tells a worker killed by SIGBUS (a loaded model file changed under it) to reinstall the model, not to ask for less', () => {
    const bus = engineError(new WorkerDiedError('crashed (SIGBUS)', true, false, 'SIGBUS'), 'sd15') as ApiError;
    expect([bus.status, bus.code]).toEqual([500, 'worker_crashed']);
    expect(bus.message).toMatch(/crashed \(SIGBUS\); it has been replaced\. A model file it had loaded was probably changed or cut short in place: .*model 'sd15' only by installing it anew \("imagegen models import --force"/);
    expect(bus.message).not.toMatch(/smaller size/);
    const segv = engineError(new WorkerDiedError('crashed (SIGSEGV)', true, false, 'SIGSEGV'), 'sd15') as ApiError;
    expect(segv.message).toMatch(/Retrying may succeed; if it keeps failing, ask for a smaller size or fewer images\.$/);
  });

  it('says a request that waited while no worker was ready was not refused for load', () => {
    const none = engineError(new QueueTimeoutError(120, 5, true), 'm') as ApiError;
    expect([none.status, none.code, none.headers['retry-after']]).toEqual([503, 'queue_timeout', '5']);
    expect(none.message).toMatch(/^The server cannot generate right now: this request waited 120s and no worker process was ready/);
    expect((engineError(new QueueTimeoutError(120, 9), 'm') as ApiError).message).toMatch(/^The server is overloaded/);
    // Held by the key's own limit, with workers free: the server is not the one to blame.
    expect((engineError(new QueueTimeoutError(3, 4, false, 1), 'm') as ApiError).message).toMatch(/^This request waited 3s behind this API key's own running requests: the key may run 1 at once \(its 'concurrent' limit\)\. Please try again in 4s/);
  });
});

describe('a worker process that dies', () => {
  it('says its batch failed only when it had taken it: a batch sent as it died waits for another worker', async () => {
    // A worker that becomes ready and never takes a batch: it dies with one sent and not yet taken.
    const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-worker-'));
    const script = path.join(dir, 'worker.mjs');
    await writeFile(script, "process.on('message', (m) => { if (m.type !== 'run') process.send({ type: 'ready' }); });");
    try {
      const exits: boolean[] = [];
      let ready!: () => void;
      const isReady = new Promise<void>((resolve) => (ready = resolve));
      const worker = new WorkerProcess({} as WorkerInit, { event: (_w, message) => message.type === 'ready' && ready(), exit: (_w, _reason, hadBatch) => exits.push(hadBatch), unready: () => undefined, output: () => undefined }, { script });
      await isReady;
      const running = worker.run({} as GenerationBatch, new AbortController().signal, () => undefined);
      process.kill(worker.pid!, 'SIGKILL');
      await expect(running).rejects.toMatchObject({ batchStarted: false });
      // The log's line for the death said "(the requests of its batch fail with 500)", while they waited and ran.
      expect(exits).toEqual([false]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
