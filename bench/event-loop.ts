import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { installModels } from '../test/helpers/real-server.js';
import type { Row } from './report.js';
import { startServerProcess } from './server-process.js';
import { ms } from './stats.js';

/**
 * Whether answering a large b64_json response stalls the server for everyone else: `imagegen serve` as
 * its own process, probed on /health back to back by this process while one client asks for n=10
 * images as b64_json. The slowest probe is the longest the server kept a health check (or any other
 * client) waiting. The baseline is the same request answered as url, which generates the same images
 * but builds no large body. The images should be ones that compress like photos: a real export's
 * (random textures) when present, else the embedded model's (flat shapes: a small body, said so).
 */

export interface StallCase {
  /** Model id and the folder to install under it; undefined for the embedded model. */
  model: string;
  dir?: string;
  size: number;
}

const N = 10;

export async function measureEventLoopStall({ model, dir, size }: StallCase): Promise<Row[]> {
  const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-stall-'));
  await installModels(path.join(root, 'models'), dir ? { [model]: { link: dir } } : {});
  const server = await startServerProcess({ WORKERS: '1', DATA_DIR: path.join(root, 'data'), MODELS_DIR: path.join(root, 'models'), PRELOAD: model });
  const { origin } = server;
  try {
    const worst = async (format: 'url' | 'b64_json') => {
      const body = { model, prompt: 'a red circle', n: N, size: `${size}x${size}`, steps: 1, guidance_scale: 0, response_format: format, seed: 3 };
      let done = false;
      let bytes = 0;
      const request = fetch(`${server.baseURL}/images/generations`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
        .then(async (res) => {
          bytes = (await res.arrayBuffer()).byteLength;
          if (res.status !== 200) throw new Error(`generation answered ${res.status}`);
        })
        .finally(() => (done = true));
      let slowest = 0;
      while (!done) {
        const started = performance.now();
        await (await fetch(`${origin}/health`)).arrayBuffer();
        slowest = Math.max(slowest, performance.now() - started);
      }
      await request;
      return { slowest, bytes };
    };
    await worst('url');
    const url = await worst('url');
    const b64 = await worst('b64_json');
    const what = `${N} x ${size}x${size} ${model}${dir ? '' : ' (flat shapes: small body)'}, ${(b64.bytes / 2 ** 20).toFixed(1)} MiB b64`;
    return [
      { group: 'slowest /health probe', case: `while ${what}; baseline: same as url`, baseline: ms(url.slowest), measured: ms(b64.slowest), ratio: b64.slowest / url.slowest, goal: '<= 20 ms', met: b64.slowest <= 20 },
    ];
  } finally {
    await server.stop();
    await rm(root, { recursive: true, force: true });
  }
}
