/**
 * Whether the server leaks under sustained traffic: `imagegen serve` as a process, with the embedded demo
 * model and its own temporary image store, takes a long run of requests from a few concurrent clients,
 * of the kinds `--paths` names (bench/soak-paths.ts; by default generations with url and b64_json
 * answers, n 1 to 4, each url's first image fetched back). Every `--every` requests it prints, for the
 * server and each worker, the resident memory (VmRSS) and open file descriptors (/proc), and from the
 * server's /metrics its V8 heap in use, its memory outside the heap (Buffers) and its active handles and resources (sockets, timers, ...), with
 * the images and other files under the data folder (temporary files included: the server's TMPDIR is
 * in it). Once the requests are done and the clients' idle connections have closed (`--settle` seconds),
 * one more reading: what is left once nothing runs.
 *
 * PASS when no request had an outcome its path does not expect, no worker was replaced, each process's
 * RSS grows by less than `--limit-mib` from the `--warmup`th request on (its highest reading past it,
 * less the reading there), and once settled the server's descriptors and active handles are within
 * `--limit-handles` of the first reading and the queue holds no job (else exit code 1).
 *
 *   npm run bench:soak -- [--paths url,b64] [--requests 20000] [--concurrency 8] [--workers 2] [--size 256]
 *                         [--steps 2] [--every 1000] [--warmup 2000] [--limit-mib 64] [--limit-handles 16]
 *                         [--settle 10] [--env NAME=VALUE ...]
 *
 * Request i takes path i mod their count. `--paths all` takes every path that needs no setting;
 * `queue-full` and `store-full` need the setting their entry names (`--env QUEUE_MAX=0`). `--env` passes
 * server settings, e.g. `--env ORT_THREAD_SPINNING=true`. Images expire after a minute so that the store
 * (on disk, not in memory) stays small.
 */
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { benchFlags, refuse, wholeNumber } from './flags.js';
import { startServerProcess } from './server-process.js';
import { SOAK_PATHS, soakPictures, type SoakTarget } from './soak-paths.js';

const { values } = benchFlags({
  options: {
    paths: { type: 'string', default: 'url,b64' },
    requests: { type: 'string', default: '20000' },
    concurrency: { type: 'string', default: '8' },
    workers: { type: 'string', default: '2' },
    size: { type: 'string', default: '256' },
    steps: { type: 'string', default: '2' },
    every: { type: 'string', default: '1000' },
    warmup: { type: 'string', default: '2000' },
    'limit-mib': { type: 'string', default: '64' },
    'limit-handles': { type: 'string', default: '16' },
    settle: { type: 'string', default: '10' },
    env: { type: 'string', multiple: true, default: [] },
  },
});
const requests = wholeNumber('requests', values.requests);
const concurrency = wholeNumber('concurrency', values.concurrency);
const every = wholeNumber('every', values.every);
const warmup = wholeNumber('warmup', values.warmup, 0);
const limitMib = wholeNumber('limit-mib', values['limit-mib']);
const limitHandles = wholeNumber('limit-handles', values['limit-handles'], 0);
const settleSeconds = wholeNumber('settle', values.settle, 0);
const steps = wholeNumber('steps', values.steps);
const workers = wholeNumber('workers', values.workers);
const side = wholeNumber('size', values.size);
if (!(warmup < requests) || warmup % every !== 0) refuse('--warmup must be a multiple of --every, below --requests');
const paths = values.paths === 'all' ? Object.keys(SOAK_PATHS).filter((name) => !SOAK_PATHS[name].needs) : values.paths.split(',');
const unknown = paths.filter((name) => !SOAK_PATHS[name]);
if (unknown.length) refuse(`unknown --paths ${unknown.join(', ')}: the paths are ${Object.keys(SOAK_PATHS).join(', ')}, or all`);
const size = `${side}x${side}`;

/** The process's resident memory (VmRSS in /proc/PID/status), in MiB; undefined once the process is gone. */
async function rssMib(pid: number): Promise<number | undefined> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => undefined);
  const kib = status && /^VmRSS:\s+(\d+) kB/m.exec(status)?.[1];
  return kib ? Number(kib) / 1024 : undefined;
}

const fds = async (pid: number) => (await readdir(`/proc/${pid}/fd`).catch(() => undefined))?.length;

/** The files under `dir` and their bytes. */
async function disk(dir: string): Promise<{ files: number; bytes: number }> {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true }).catch(() => []);
  const files = entries.filter((entry) => entry.isFile());
  const sizes = await Promise.all(files.map((entry) => stat(path.join(entry.parentPath, entry.name)).then((s) => s.size, () => 0)));
  return { files: files.length, bytes: sizes.reduce((a, b) => a + b, 0) };
}

const dataDir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-soak-'));
const KEY = 'soak-key-unlimited-0123456789';
const LIMITED_KEY = 'soak-key-limited-0123456789';
await mkdir(path.join(dataDir, 'tmp'));
await writeFile(path.join(dataDir, 'keys'), `soak:${KEY}\nlimited:${LIMITED_KEY} requests_per_minute=1\n`);
const server = await startServerProcess({
  WORKERS: String(workers),
  DATA_DIR: dataDir,
  // Temporary files (uploads, if any were spooled) land where the readings count them.
  TMPDIR: path.join(dataDir, 'tmp'),
  API_KEYS_FILE: path.join(dataDir, 'keys'),
  IMAGE_TTL_SECONDS: '60',
  MAX_STORE_BYTES: '1g',
  // Its least: a body left counted after its request ended would soon turn every upload away (429).
  UPLOAD_MEMORY: '128m',
  // Idle connections close (the server's end, and the clients' by its Keep-Alive hint) before the settled reading.
  KEEP_ALIVE_TIMEOUT_SECONDS: '3',
  ...Object.fromEntries(values.env.map((pair) => pair.split(/=(.*)/s, 2))),
});
const target: SoakTarget = { baseURL: server.baseURL, origin: server.origin, key: KEY, limitedKey: LIMITED_KEY, ...(await soakPictures()) };

/** The sum of a metric's samples in Prometheus text, over all its labels (imagegen_queue_jobs has one per state). */
function metric(text: string, name: string): number {
  const lines = text.split('\n').filter((line) => line.startsWith(`${name}{`) || line.startsWith(`${name} `));
  return lines.reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0);
}

/** Processes by name: the server, then its workers by slot. */
const processes = () => [['server', server.pid] as const, ...server.workerPids().map((pid, slot) => [`worker ${slot}`, pid] as const)];
/** Readings by series name ("server MiB", "server fds", ...); `at` holds the request counts they were taken at (-1: settled). */
const readings = new Map<string, number[]>();
const at: number[] = [];
async function sample(done: number): Promise<void> {
  at.push(done);
  const perProcess = await Promise.all(
    processes().map(async ([name, pid]) => [
      [`${name} MiB`, (await rssMib(pid)) ?? NaN],
      [`${name} fds`, (await fds(pid)) ?? NaN],
    ]),
  );
  const scrape = await (await fetch(`${server.origin}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })).text();
  const files = await disk(dataDir);
  const row: [string, number][] = [
    ...(perProcess.flat() as [string, number][]),
    ['server heap MiB', metric(scrape, 'imagegen_nodejs_heap_size_used_bytes') / 2 ** 20],
    // Buffers live outside the heap: uploads, images, answers.
    ['server external MiB', metric(scrape, 'imagegen_nodejs_external_memory_bytes') / 2 ** 20],
    ['server handles', metric(scrape, 'imagegen_nodejs_active_handles_total')],
    ['server resources', metric(scrape, 'imagegen_nodejs_active_resources_total')],
    ['queue jobs', metric(scrape, 'imagegen_queue_jobs')],
    ['store images', metric(scrape, 'imagegen_store_images')],
    ['disk files', files.files],
    ['disk MiB', files.bytes / 2 ** 20],
  ];
  for (const [name, value] of row) readings.set(name, [...(readings.get(name) ?? []), value]);
  const shown = (value: number) => (Number.isInteger(value) ? String(value) : value.toFixed(1));
  console.log(`${done < 0 ? 'settled' : String(done).padStart(7)}  ${row.map(([name, value]) => `${name} ${shown(value)}`).join('  ')}`);
}

const failures = new Map<string, number>();
/** Outcomes by path ("200", "429", "aborted", ...), with their counts. */
const outcomes = new Map<string, Map<string, number>>(paths.map((name) => [name, new Map()]));
let started = 0;
let done = 0;
let sampling = Promise.resolve();
const count = (counts: Map<string, number>, key: string) => counts.set(key, (counts.get(key) ?? 0) + 1);

async function client(): Promise<void> {
  while (started < requests) {
    const i = started++;
    const name = paths[i % paths.length];
    await SOAK_PATHS[name]
      .run(Math.floor(i / paths.length), target, size, steps)
      .then((outcome) => count(outcomes.get(name)!, outcome))
      .catch((err: Error) => count(failures, `${name}: ${err.message}`));
    if (++done % every === 0) sampling = sampling.then(() => sample(done));
  }
}

const begun = performance.now();
let seconds = 0;
try {
  console.log(`soak: ${requests} requests (${paths.join(', ')}), concurrency ${concurrency}, ${workers} worker(s), ${size}, ${steps} steps; readings every ${every}`);
  for (const name of paths) if (SOAK_PATHS[name].needs) console.log(`  ${name} reaches its refusals with ${SOAK_PATHS[name].needs}`);
  await sample(0);
  await Promise.all(Array.from({ length: concurrency }, client));
  await sampling;
  seconds = (performance.now() - begun) / 1000;
  // The clients' idle keep-alive connections close (KEEP_ALIVE_TIMEOUT_SECONDS); abandoned work ends at its next step.
  await new Promise((resolve) => setTimeout(resolve, settleSeconds * 1000));
  await sample(-1);
} finally {
  await server.stop();
  await rm(dataDir, { recursive: true, force: true });
}

const series = (name: string) => readings.get(name) ?? [];
const from = at.indexOf(warmup);
const running = (values: number[]) => values.slice(0, -1);
const growth = [...readings.keys()].filter((name) => name.endsWith(' MiB') && !name.startsWith('disk')).map((name) => [name, Math.max(...running(series(name)).slice(from)) - series(name)[from]] as const);
const settled = (name: string) => series(name).at(-1)! - series(name)[0];
const leftOver = ['server fds', 'server handles', 'server resources'].map((name) => [name, settled(name)] as const);
const replaced = server.workerPids().length !== workers || server.replacements() > 0;
const rssGrowth = growth.filter(([name]) => !name.includes('heap') && !name.includes('external'));
const pass = rssGrowth.every(([, mib]) => mib < limitMib) && leftOver.every(([, n]) => n < limitHandles) && series('queue jobs').at(-1) === 0 && failures.size === 0 && !replaced;

console.log(`${done} requests in ${seconds.toFixed(0)} s (${(done / seconds).toFixed(1)} requests/s)`);
for (const [name, counts] of outcomes) console.log(`  ${name.padEnd(13)} ${[...counts].map(([outcome, n]) => `${outcome} x ${n}`).join(', ')}`);
for (const [reason, n] of failures) console.log(`  failed: ${n} x ${reason}`);
if (replaced) console.log(`  a worker was replaced during the run (${server.replacements()} times): its readings are not one process's`);
console.log(`growth after the first ${warmup} requests (peak less the reading at ${warmup}; RSS limit ${limitMib} MiB):`);
for (const [name, mib] of growth) console.log(`  ${name.padEnd(16)} ${mib.toFixed(1).padStart(7)}`);
console.log(`settled, less the first reading (limit ${limitHandles}), and the jobs left in the queue:`);
for (const [name, n] of leftOver) console.log(`  ${name.padEnd(16)} ${String(n).padStart(7)}`);
console.log(`  ${'queue jobs'.padEnd(16)} ${String(series('queue jobs').at(-1)).padStart(7)}`);
console.log(pass ? 'PASS' : 'FAIL');
process.exitCode = pass ? 0 : 1;
