import { spawn } from 'node:child_process';
import { mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { snippetsOf } from '../web/snippets.js';
import { holdNextBatch } from './helpers/busy-worker.js';
import { generate, metric, MODEL, OPS_KEY, scrape, startOpsServer, type OpsServer } from './helpers/ops-server.js';
import { readImageFile } from './helpers/picture.js';

/**
 * The playground's "Copy as code" Node snippet of an edit, run with the real openai-node client against
 * a real server that refuses it at first (its one worker busy, QUEUE_MAX=0: 429 with Retry-After). The
 * SDK retries a 429 only when it can send the upload again, which it cannot for a stream passed as it
 * is (docs/api.md, openai-node versions): the snippet must read its files whole first.
 */

let ops: OpsServer;
let work: string;

beforeAll(async () => {
  ops = await startOpsServer({ env: { QUEUE_MAX: '0' } });
  work = await mkdtemp(path.join(os.tmpdir(), 'imagegen-snippet-'));
  // The real openai-node client, from the project's node_modules.
  await symlink(path.resolve('node_modules'), path.join(work, 'node_modules'));
});

afterAll(async () => {
  await ops?.close();
  if (work) await rm(work, { recursive: true, force: true });
});

/** Runs `node snippet.mjs` in the work folder; answers its exit status and what it wrote to stderr. */
function runSnippet(): Promise<{ status: number | null; stderr: string }> {
  const child = spawn(process.execPath, ['snippet.mjs'], { cwd: work, env: { ...process.env, OPENAI_API_KEY: OPS_KEY }, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  return new Promise((resolve) => child.on('close', (status) => resolve({ status, stderr })));
}

/** Edits the server answered 429, from its metrics. */
async function editsRefused(): Promise<number> {
  return metric(await scrape(ops.server.url), 'imagegen_http_requests_total{method="POST",route="/v1/images/edits",status="429"}') ?? 0;
}

describe("the playground's Node snippet of an edit", () => {
  it('is retried by openai-node after a 429, its picture read whole rather than streamed', async () => {
    const picture = await sharp({ create: { width: 128, height: 128, channels: 3, background: { r: 128, g: 128, b: 128 } } }).png().toBuffer();
    await writeFile(path.join(work, 'image.png'), picture);
    const fields = { model: MODEL, prompt: 'a red circle', size: '128x128', steps: 4, seed: 7, strength: 1 };
    const { node } = snippetsOf(ops.baseURL, { route: 'edits', fields, image: new Blob([picture], { type: 'image/png' }) });
    await writeFile(path.join(work, 'snippet.mjs'), node);

    // The one worker held with a batch of its own: the edit finds no worker and no place in the queue.
    await expect.poll(() => ops.server.engine.readiness().ready, { timeout: 60_000 }).toBe(true);
    const { sent, resume } = await holdNextBatch(ops.server.engine, () => generate(ops.baseURL));
    let run: Promise<{ status: number | null; stderr: string }>;
    try {
      run = runSnippet();
      await expect.poll(editsRefused, { timeout: 30_000 }).toBeGreaterThan(0);
    } finally {
      resume();
    }
    const { status, stderr } = await run;
    expect(stderr).toBe('');
    expect(status).toBe(0);
    expect((await sent).status).toBe(200);
    const { reading } = await readImageFile(path.join(work, 'image-7.png'));
    expect(reading).toMatchObject({ colour: 'red', shape: 'circle' });
  });
});
