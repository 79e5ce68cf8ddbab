/**
 * Whether the server's memory stays flat under sustained traffic: `imagegen serve` as a process, with
 * the embedded demo model and its own temporary image store, takes a long run of generations (url and
 * b64_json answers, n 1 to 4, each url's first image fetched back) from a few concurrent clients. Every
 * `--every` requests it prints the resident memory (VmRSS) of the server and of each worker; at the end,
 * each process's growth from the `--warmup`th request on (its highest reading past it, less the reading
 * there), with PASS when every one stays under `--limit-mib` and no request failed (else exit code 1).
 *
 *   npm run bench:soak -- [--requests 20000] [--concurrency 8] [--workers 2] [--size 256] [--steps 2]
 *                         [--every 1000] [--warmup 2000] [--limit-mib 64] [--env NAME=VALUE ...]
 *
 * `--env` passes server settings, e.g. `--env ORT_THREAD_SPINNING=true`. Images expire after a minute
 * so that the store (on disk, not in memory) stays small.
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { startServerProcess } from './server-process.js';

const { values } = parseArgs({
  options: {
    requests: { type: 'string', default: '20000' },
    concurrency: { type: 'string', default: '8' },
    workers: { type: 'string', default: '2' },
    size: { type: 'string', default: '256' },
    steps: { type: 'string', default: '2' },
    every: { type: 'string', default: '1000' },
    warmup: { type: 'string', default: '2000' },
    'limit-mib': { type: 'string', default: '64' },
    env: { type: 'string', multiple: true, default: [] },
  },
});
const [requests, concurrency, every, warmup, limitMib] = [values.requests, values.concurrency, values.every, values.warmup, values['limit-mib']].map(Number);
if (!(warmup < requests) || warmup % every !== 0) throw new Error('--warmup must be a multiple of --every, below --requests');

const PROMPTS = ['a red circle', 'a big blue square', 'a small green triangle', 'a yellow circle on the left', 'an orange square'];

/** Resident memory in MiB, from /proc (Linux); undefined once the process is gone. */
async function rssMib(pid: number): Promise<number | undefined> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => undefined);
  const kib = status && /^VmRSS:\s+(\d+) kB/m.exec(status)?.[1];
  return kib ? Number(kib) / 1024 : undefined;
}

const dataDir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-soak-'));
const server = await startServerProcess({
  WORKERS: values.workers,
  DATA_DIR: dataDir,
  IMAGE_TTL_SECONDS: '60',
  MAX_STORE_BYTES: '1g',
  ...Object.fromEntries(values.env.map((pair) => pair.split(/=(.*)/s, 2))),
});

/** Processes by name: the server, then its workers by slot. */
const processes = () => [['server', server.pid] as const, ...server.workerPids().map((pid, slot) => [`worker ${slot}`, pid] as const)];
/** RSS readings by process name; `at` holds the request counts they were taken at. */
const readings = new Map<string, number[]>();
const at: number[] = [];
async function sample(done: number): Promise<void> {
  at.push(done);
  const row = await Promise.all(processes().map(async ([name, pid]) => [name, (await rssMib(pid)) ?? NaN] as const));
  for (const [name, mib] of row) readings.set(name, [...(readings.get(name) ?? []), mib]);
  console.log(`${String(done).padStart(7)} requests  ${row.map(([name, mib]) => `${name} ${mib.toFixed(1).padStart(7)} MiB`).join('  ')}`);
}

const failures = new Map<string, number>();
let images = 0;
let started = 0;
let done = 0;
let sampling = Promise.resolve();

/** One request of the mix; counts a failure by what went wrong. */
async function request(i: number): Promise<void> {
  const format = i % 2 === 0 ? 'url' : 'b64_json';
  const body = { model: 'demo-shapes', prompt: PROMPTS[i % PROMPTS.length], n: 1 + (i % 4), size: `${values.size}x${values.size}`, steps: Number(values.steps), response_format: format, seed: i };
  const res = await fetch(`${server.baseURL}/images/generations`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const answer = (await res.json()) as { data?: { url?: string; b64_json?: string }[] };
  if (res.status !== 200 || answer.data?.length !== body.n) throw new Error(`generation answered ${res.status}`);
  images += body.n;
  if (format === 'url') {
    const image = await fetch(answer.data[0].url!);
    await image.arrayBuffer();
    if (image.status !== 200) throw new Error(`image URL answered ${image.status}`);
  }
}

async function client(): Promise<void> {
  while (started < requests) {
    const i = started++;
    await request(i).catch((err: Error) => failures.set(err.message, (failures.get(err.message) ?? 0) + 1));
    if (++done % every === 0) sampling = sampling.then(() => sample(done));
  }
}

const begun = performance.now();
try {
  console.log(`soak: ${requests} requests, concurrency ${concurrency}, ${values.workers} worker(s), ${values.size}x${values.size}, ${values.steps} steps; RSS every ${every}`);
  await sample(0);
  await Promise.all(Array.from({ length: concurrency }, client));
  await sampling;
} finally {
  await server.stop();
  await rm(dataDir, { recursive: true, force: true });
}

const seconds = (performance.now() - begun) / 1000;
const from = at.indexOf(warmup);
const growth = [...readings].map(([name, mibs]) => [name, Math.max(...mibs.slice(from)) - mibs[from]] as const);
const replaced = server.workerPids().length !== Number(values.workers) || server.replacements() > 0;
const pass = growth.every(([, mib]) => mib < limitMib) && failures.size === 0 && !replaced;
console.log(`${done} requests, ${images} images in ${seconds.toFixed(0)} s (${(done / seconds).toFixed(1)} requests/s)`);
for (const [reason, count] of failures) console.log(`  failed: ${count} x ${reason}`);
if (replaced) console.log(`  a worker was replaced during the run (${server.replacements()} times): its readings are not one process's`);
console.log(`growth after the first ${warmup} requests (peak less the reading at ${warmup}), limit ${limitMib} MiB:`);
for (const [name, mib] of growth) console.log(`  ${name.padEnd(9)} ${mib.toFixed(1).padStart(7)} MiB`);
console.log(pass ? 'PASS' : 'FAIL');
process.exitCode = pass ? 0 : 1;
