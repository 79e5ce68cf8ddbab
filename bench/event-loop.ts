import { fork, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { installModels } from '../test/helpers/real-server.js';
import type { Row } from './report.js';
import { startServerProcess } from './server-process.js';
import { ms } from './stats.js';
import { clientEnvironment } from './worker-malloc.js';

/**
 * Whether answering a large b64_json response stalls the server for everyone else: `imagegen serve` as
 * its own process, probed on /health back to back while one client asks for n=10 images as b64_json.
 * The baseline is the same request answered as url, which generates the same images but builds no
 * large body. The images should be ones that compress like photos: a real export's (random textures)
 * when present, else the embedded model's (flat shapes: a small body, said so).
 *
 * Two views of the same stall:
 *  - the slowest probe, sent from a process of its own and warmed up first, so that neither this
 *    process reading the 10 MiB answer nor the probe's own first requests (which load and compile its
 *    HTTP client) are timed as the server's;
 *  - the server's own view, `imagegen_nodejs_eventloop_lag_max_seconds` from /metrics (read once before
 *    the request, which starts its window, and once after): the longest gap between two ticks of a 10 ms
 *    timer, so an event-loop turn of t ms shows as t to t + 10 ms.
 *
 * And the machine's floor: a bare node:http server in a process of its own, answering what /health
 * answers, probed in turn with the server by the same probe during the same requests. What it waits
 * is the kernel's scheduling and the probe's own process, which no change to the server can shorten.
 */

type ToProbe = { type: 'start' } | { type: 'stop' };
interface ProbeResult {
  slowest: number;
  /** The 99th percentile of the probes' times. */
  p99: number;
}

/** Probes each origin's /health in turn, back to back, between 'start' and 'stop'; answers one ProbeResult per origin. */
if (process.argv[2] === '--health-probe') {
  const origins = process.argv.slice(3);
  const probe = async (origin: string) => {
    const started = performance.now();
    await (await fetch(`${origin}/health`)).arrayBuffer();
    return performance.now() - started;
  };
  for (let i = 0; i < 50; i++) for (const origin of origins) await probe(origin);
  let probing = false;
  process.on('message', async (message: ToProbe) => {
    if (message.type === 'stop') {
      probing = false;
      return;
    }
    probing = true;
    const times = origins.map((): number[] => []);
    process.send!({ type: 'started' });
    while (probing) for (const [i, origin] of origins.entries()) times[i].push(await probe(origin));
    process.send!(times.map((list): ProbeResult => {
      list.sort((a, b) => a - b);
      return { slowest: list.at(-1) ?? 0, p99: list[Math.floor(list.length * 0.99)] ?? 0 };
    }));
  });
  process.send!({ type: 'ready' });
}

/** The floor's server: answers every request as /health does, and says its port. */
if (process.argv[2] === '--bare-server') {
  const bare = createServer((_req, res) => res.setHeader('content-type', 'application/json').end('{"status":"ok"}'));
  bare.listen(0, '127.0.0.1', () => process.send!((bare.address() as AddressInfo).port));
}

/** This file forked with `args`, once it has sent its first message (which the promise resolves with); rejects if it exits first. */
async function forkSelf<T>(args: string[]): Promise<{ child: ChildProcess; first: T }> {
  const child = fork(fileURLToPath(import.meta.url), args, { execArgv: ['--import', 'tsx'], env: clientEnvironment() });
  const exited = once(child, 'exit').then(([code]) => {
    throw new Error(`${args[0]} exited with ${code} before it was ready`);
  });
  const [first] = (await Promise.race([once(child, 'message'), exited])) as [T];
  return { child, first };
}

export interface StallCase {
  /** Model id and the folder to install under it; undefined for the embedded model. */
  model: string;
  dir?: string;
  size: number;
}

const N = 10;

interface Stall extends ProbeResult {
  /** The server's own slowest event-loop gap, in ms. */
  lag: number;
  bytes: number;
  /** The bare server's probes during the same request. */
  floor: ProbeResult;
}

/** The stalls of a server (with `env` over the suite's settings) while it answers the request as url and as b64_json. */
async function stallsOf({ model, dir, size }: StallCase, env: Record<string, string> = {}): Promise<{ url: Stall; b64: Stall }> {
  const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-stall-'));
  await installModels(path.join(root, 'models'), dir ? { [model]: { link: dir } } : {});
  const server = await startServerProcess({ WORKERS: '1', DATA_DIR: path.join(root, 'data'), MODELS_DIR: path.join(root, 'models'), PRELOAD: model, ...env });
  const children: ChildProcess[] = [];
  const started = async <T>(args: string[]) => {
    const forked = await forkSelf<T>(args);
    children.push(forked.child);
    return forked.first;
  };
  const lagMax = async () => {
    const text = await (await fetch(`${server.origin}/metrics`)).text();
    const line = /^imagegen_nodejs_eventloop_lag_max_seconds (\S+)$/m.exec(text);
    if (!line) throw new Error('/metrics has no imagegen_nodejs_eventloop_lag_max_seconds');
    return Number(line[1]) * 1000;
  };
  try {
    const barePort = await started<number>(['--bare-server']);
    await started(['--health-probe', server.origin, `http://127.0.0.1:${barePort}`]);
    const probe = children[1];
    const fromProbe = <T>() => once(probe, 'message').then(([message]) => message as T);
    const worst = async (format: 'url' | 'b64_json'): Promise<Stall> => {
      const body = { model, prompt: 'a red circle', n: N, size: `${size}x${size}`, steps: 1, guidance_scale: 0, response_format: format, seed: 3 };
      await lagMax();
      probe.send({ type: 'start' } satisfies ToProbe);
      await fromProbe();
      const res = await fetch(`${server.baseURL}/images/generations`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      const bytes = (await res.arrayBuffer()).byteLength;
      if (res.status !== 200) throw new Error(`generation answered ${res.status}`);
      const answer = fromProbe<ProbeResult[]>();
      probe.send({ type: 'stop' } satisfies ToProbe);
      const [ours, floor] = await answer;
      return { ...ours, floor, lag: await lagMax(), bytes };
    };
    // Both paths run once first: the first run of any code compiles it, a one-off stall.
    await worst('url');
    await worst('b64_json');
    return { url: await worst('url'), b64: await worst('b64_json') };
  } finally {
    for (const child of children) child.kill();
    await server.stop();
    await rm(root, { recursive: true, force: true });
  }
}

/**
 * The stalls of the default server, of one whose workers run at the server's own CPU priority
 * (WORKER_NICE=0): what the workers' lower priority is worth to everyone else while they use every core,
 * and of one whose workers' malloc takes no huge pages (MALLOC_HUGE_PAGES=false): whether the kernel's
 * work for them (faults of 2 MiB, compaction) costs the server's event loop.
 */
export async function measureEventLoopStall(stallCase: StallCase): Promise<Row[]> {
  // Discarded: the first server the group started was the slowest whatever its configuration (the
  // default's slowest probe 144 and 118 ms first, 67 ms after MALLOC_HUGE_PAGES=false's 112 ms).
  await stallsOf(stallCase);
  const { url, b64 } = await stallsOf(stallCase);
  const equal = await stallsOf(stallCase, { WORKER_NICE: '0' });
  const smallPages = await stallsOf(stallCase, { MALLOC_HUGE_PAGES: 'false' });
  const { model, dir, size } = stallCase;
  const what = `${N} x ${size}x${size} ${model}${dir ? '' : ' (flat shapes: small body)'}, ${(b64.bytes / 2 ** 20).toFixed(1)} MiB b64`;
  return [
    { group: 'slowest /health probe', case: `while ${what}; baseline: same as url`, baseline: ms(url.slowest), measured: ms(b64.slowest), ratio: b64.slowest / url.slowest, goal: '<= 20 ms', met: b64.slowest <= 20 },
    {
      group: 'slowest /health probe',
      case: `same b64 requests; baseline: a bare node:http server probed in turn with it (this machine's floor)`,
      baseline: ms(b64.floor.slowest),
      measured: ms(b64.slowest),
      ratio: b64.slowest / b64.floor.slowest,
    },
    { group: 'slowest event-loop gap', case: `the server's own (/metrics, 10 ms timer), same requests`, baseline: ms(url.lag), measured: ms(b64.lag), ratio: b64.lag / url.lag },
    {
      group: 'slowest /health probe',
      case: `same b64 requests; baseline: workers at the server's CPU priority (WORKER_NICE=0), measured: below it (default 10)`,
      baseline: ms(equal.b64.slowest),
      measured: ms(b64.slowest),
      ratio: b64.slowest / equal.b64.slowest,
    },
    {
      group: '99th pct /health probe',
      case: `same requests and configurations`,
      baseline: ms(equal.b64.p99),
      measured: ms(b64.p99),
      ratio: b64.p99 / equal.b64.p99,
    },
    {
      group: 'slowest /health probe',
      case: `same b64 requests; baseline: workers without huge pages (MALLOC_HUGE_PAGES=false), measured: with them (default)`,
      baseline: ms(smallPages.b64.slowest),
      measured: ms(b64.slowest),
      ratio: b64.slowest / smallPages.b64.slowest,
    },
    { group: 'slowest event-loop gap', case: `same configurations`, baseline: ms(smallPages.b64.lag), measured: ms(b64.lag), ratio: b64.lag / smallPages.b64.lag },
    { group: '99th pct /health probe', case: `same configurations`, baseline: ms(smallPages.b64.p99), measured: ms(b64.p99), ratio: b64.p99 / smallPages.b64.p99 },
  ];
}
