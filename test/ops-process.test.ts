import { spawnSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { readdir, readFile, rm, utimes, writeFile } from 'node:fs/promises';
import { get } from 'node:https';
import { connect, createServer, type AddressInfo } from 'node:net';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it, onTestFinished } from 'vitest';
import { holdProcesses } from './helpers/busy-worker.js';
import { haveOpenssl, selfSignedCertificate } from './helpers/certificate.js';
import { generate, LONG, makeRoot, OPS_KEY, rootEnv, sleep, untilReady } from './helpers/ops-server.js';
import { spawnServer, workerProcesses, type ServerProcess, type SpawnOptions } from './helpers/server-process.js';

/**
 * `imagegen serve` as a process: graceful shutdown on SIGTERM, and a disk that fails mid-write. The
 * CLI runs built, as `npm start` runs it (helpers/server-process.ts).
 */

/** This test's server: the root's folders, an ephemeral port. */
const spawnIn = (root: string, { env = {}, ...options }: SpawnOptions & { env?: Record<string, string> } = {}) =>
  spawnServer({ ...rootEnv(root), PORT: '0', ...env }, options);

async function whenBusy(origin: string): Promise<void> {
  while (((await (await fetch(`${origin}/health`)).json()) as { queue: { running: number } }).queue.running === 0) await sleep(5);
}

let root: string;
let server: ServerProcess | undefined;
beforeEach(async () => {
  root = await makeRoot();
});
afterEach(async () => {
  if (server?.child.exitCode === null) server.child.kill('SIGKILL');
  server = undefined;
  await rm(root, { recursive: true, force: true });
});

const images = () => readdir(path.join(root, 'data', 'images'));

/** Whether a process runs (from /proc: an exited orphan may linger as a zombie where nothing reaps it). */
async function processRuns(pid: number): Promise<boolean> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => undefined);
  return stat !== undefined && stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
}

/**
 * Sends what `send` sends with every worker of `server` held (SIGSTOP) and resolves once a worker has its
 * generation (whenBusy): it cannot end before the test signalled the server, however small it is and
 * however slow the test. `resume` lets the workers go on.
 */
async function heldGeneration<T>(server: ServerProcess, send: () => Promise<T>): Promise<{ running: Promise<T>; resume: () => void }> {
  const resume = holdProcesses(await workerProcesses(server));
  const running = send();
  await whenBusy(server.origin);
  return { running, resume };
}

/** Resolves once the server logged that it took `signal` as the first (it finishes running requests). */
const untilTaken = (server: ServerProcess, signal: NodeJS.Signals) => expect.poll(() => server.log.some((line) => line.includes(`${signal}: finishing running requests`))).toBe(true);

/** A generation the test holds until the signal was taken and then waits to finish (two images: the store keeps each). */
const FINISHING = { n: 2 } as const;

describe('SIGTERM', () => {
  it('lets the running generation finish and store its images, removes stray temporary files, and exits 0', async () => {
    server = await spawnIn(root);
    await untilReady(server.origin);
    // What a write cut short by a crash an hour ago would have left (a recent one may be another server's write in progress).
    const crashed = path.join(root, 'data', 'images', '.0123456789abcdef0123456789abcdef.tmp');
    await writeFile(crashed, 'half an image');
    await utimes(crashed, new Date(Date.now() - 3600_000), new Date(Date.now() - 3600_000));
    const { running, resume } = await heldGeneration(server, () => generate(server!.baseURL, { ...FINISHING, response_format: 'url' }));
    server.child.kill('SIGTERM');
    await untilTaken(server, 'SIGTERM');
    resume();

    const answer = await running;
    expect(answer.status).toBe(200);
    expect(answer.body.data).toHaveLength(FINISHING.n);
    expect(await server.exited).toBe(0);
    const files = await images();
    expect(files).toHaveLength(FINISHING.n);
    expect(files.every((name) => name.endsWith('.png'))).toBe(true);
    expect(server.log.join('\n')).toMatch(/SIGTERM: finishing running requests/);
  });

  it('cancels requests still running at SHUTDOWN_TIMEOUT_SECONDS with a retryable 503, and exits 0', async () => {
    server = await spawnIn(root, { env: { SHUTDOWN_TIMEOUT_SECONDS: '0' } });
    await untilReady(server.origin);
    const running = generate(server.baseURL, LONG);
    await whenBusy(server.origin);
    server.child.kill('SIGTERM');

    const answer = await running;
    expect(answer.status).toBe(503);
    expect(answer.body.error).toMatchObject({ type: 'server_error', code: 'server_shutting_down', param: null });
    expect(answer.headers.get('retry-after')).toBe('5');
    expect(await server.exited).toBe(0);
    expect(server.log.join('\n')).toMatch(/shutdown deadline passed/);
  });
});

describe('a signal to the whole process group (Ctrl-C in a terminal, systemd stopping the service)', () => {
  it('reaches the workers too, which leave stopping to the server: the running generation finishes, and it exits 0', async () => {
    server = await spawnIn(root, { group: true });
    await untilReady(server.origin);
    const { running, resume } = await heldGeneration(server, () => generate(server!.baseURL, FINISHING));
    process.kill(-server.child.pid!, 'SIGINT');
    await untilTaken(server, 'SIGINT');
    // The held worker takes its SIGINT as it goes on, its generation begun.
    resume();

    const answer = await running;
    expect([answer.status, answer.body.error?.message]).toEqual([200, undefined]);
    expect(answer.body.data).toHaveLength(FINISHING.n);
    expect(await server.exited).toBe(0);
    expect(server.log.join('\n')).not.toMatch(/starting a replacement/);
  });

  it('is taken once when it comes twice at once, as GNU timeout sends it (to the server, then to its group): the generation finishes, and it exits 0', async () => {
    server = await spawnIn(root, { group: true });
    await untilReady(server.origin);
    const { running, resume } = await heldGeneration(server, () => generate(server!.baseURL, FINISHING));
    server.child.kill('SIGTERM');
    // Apart enough for the server to have taken the first (sent back to back, the kernel may merge them).
    await sleep(50);
    process.kill(-server.child.pid!, 'SIGTERM');
    // The generation held until the server has had time to take the second too (it says nothing of it).
    await untilTaken(server, 'SIGTERM');
    await sleep(500);
    resume();

    // Before, the second was 'SIGTERM again': the server exited at once, and the generation was lost.
    const answer = await running;
    expect([answer.status, answer.body.error?.message]).toEqual([200, undefined]);
    expect(await server.exited).toBe(0);
    expect(server.log.join('\n')).not.toMatch(/again: exiting/);
    // What to do to exit at once says when: a second sent sooner is taken for the same one.
    expect(server.log.join('\n')).toContain('SIGTERM: finishing running requests, then exiting (send it again, a second or more after this one, to exit at once)');
  });

  // A person may press Ctrl-C after a supervisor's SIGTERM: the line says which came after which.
  it.each([
    ['SIGTERM', 'SIGTERM again'],
    ['SIGINT', 'SIGINT after SIGTERM'],
  ] as const)('sent again later (%s), as a person sends it, exits at once without waiting for the running generation', async (second, said) => {
    server = await spawnIn(root);
    await untilReady(server.origin);
    const workers = await workerProcesses(server);
    // Its worker held, so that the generation outlasts the second's wait on any machine (the pool notices
    // nothing). The connection goes with the process.
    const { running, resume } = await heldGeneration(server, () =>
      generate(server!.baseURL).then(
        () => 'answered',
        (err: unknown) => err,
      ),
    );
    server.child.kill('SIGTERM');
    // Timed from when the server took the first (its line comes after): from the kill, a loaded machine's
    // delay in delivering it could bring the two within the second that makes them one.
    await untilTaken(server, 'SIGTERM');
    await sleep(1200);
    server.child.kill(second);
    expect(await server.exited).toBe(1);
    expect(server.log.join('\n')).toContain(`${said}: exiting without waiting for running requests`);
    expect(await running).toBeInstanceOf(TypeError);
    try {
      // The workers end with it while still held, as one hung in native code must: before, each ended only
      // once it ran again and heard its channel close, and a hung one stayed behind with its models' memory.
      for (const pid of workers) await expect.poll(() => processRuns(pid), { timeout: 3000, interval: 20 }).toBe(false);
    } finally {
      resume();
    }
  });
});

describe('SIGTERM with a client that stopped reading', () => {
  it('closes its connection once the deadline passed, and exits', async () => {
    server = await spawnIn(root, { env: { SHUTDOWN_TIMEOUT_SECONDS: '1' } });
    await untilReady(server.origin);
    // Ten 1024x1024 pictures as base64 (tens of MiB): more than the sockets' buffers hold, and the client reads none of it.
    const body = JSON.stringify({ model: 'demo-shapes', prompt: 'a red circle', n: 10, size: '1024x1024', steps: 2, response_format: 'b64_json' });
    const socket = connect(Number(new URL(server.origin).port), '127.0.0.1');
    socket.pause();
    socket.write(`POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${OPS_KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    try {
      // Ten 1024x1024 pictures took 45 s with the machine's load at 15 on 2 cores: this waits for them up to
      // the test's own limit, which only ends a hang.
      await expect.poll(() => server!.log.some((line) => line.includes('"images generated"')), { timeout: 240_000 }).toBe(true);
      server.child.kill('SIGTERM');
      const exited = await Promise.race([server.exited, sleep(20_000).then(() => 'still running 20 s after SIGTERM')]);
      expect(exited).toBe(0);
      expect(server.log.join('\n')).toMatch(/closing connections whose answers are still being written/);
    } finally {
      socket.destroy();
    }
  }, 300_000);
});

describe('a server that cannot start', () => {
  it('says which setting to change, without a stack trace', async () => {
    // The port taken by another program (a listener of this process).
    const holder = createServer();
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
    onTestFinished(() => void holder.close());
    const port = String((holder.address() as AddressInfo).port);
    const failure = (env: Record<string, string>) => spawnIn(root, { env }).then(() => expect.fail('it started'), (err: Error) => err.message);
    const notPem = path.join(root, 'not-a-certificate.txt');
    await writeFile(notPem, 'hello');
    // Servers that exit as they start, each on its own: started all at once.
    const [taken, missing, folder, notCertificate, noBody] = await Promise.all([
      failure({ PORT: port }),
      failure({ TLS_CERT: '/nonexistent/cert.pem', TLS_KEY: '/nonexistent/key.pem' }),
      // A folder: the system's error (EISDIR) names no path at all, and was logged with its stack trace.
      failure({ TLS_CERT: root, TLS_KEY: root }),
      failure({ TLS_CERT: notPem, TLS_KEY: notPem }),
      failure({ BODY_LIMIT: '0' }),
    ]);
    expect(taken).toMatch(new RegExp(`exited with 1 before listening:\\nimagegen serve cannot start: port ${port} on 127\\.0\\.0\\.1 is already in use.*set PORT to a free port`));
    expect(taken).not.toMatch(/\n\s+at /);
    expect(missing).toMatch(/cannot start: TLS_CERT \/nonexistent\/cert\.pem does not exist: set TLS_CERT to the PEM certificate/);
    expect(folder).toMatch(/exited with 1 before listening:\nimagegen serve cannot start: TLS_CERT .* is a folder: set TLS_CERT to the PEM certificate/);
    expect(folder).not.toMatch(/\n\s+at /);
    expect(notCertificate).toMatch(/cannot start: TLS_CERT \(.*not-a-certificate\.txt\) and TLS_KEY \(.*\) cannot be used: .*PEM.*They must be the PEM certificate/);
    expect(noBody).toMatch(/exited with 2 before listening:[^]*BODY_LIMIT \(--body-limit\): expected at least 1 byte/);
  });

  /** A tmpfs with no inode left for a folder (mount needs root, as CI has), or why there is none. */
  function fullDisk(): { dir: string; unmount(): void } | { why: string } {
    const dir = path.join(root, 'full-disk');
    mkdirSync(dir);
    const mounted = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=64k,nr_inodes=1', 'tmpfs', dir]);
    if (mounted.status !== 0) return { why: `cannot mount a tmpfs (${mounted.stderr?.toString().trim() || mounted.error?.message})` };
    return { dir, unmount: () => void spawnSync('umount', [dir]) };
  }

  it('says what to do about a DATA_DIR on a full disk (skipped where no tmpfs can be mounted)', async (context) => {
    const disk = fullDisk();
    if ('why' in disk) return context.skip(disk.why);
    try {
      const refused = await spawnIn(root, { env: { DATA_DIR: disk.dir } }).then(
        () => expect.fail('it started'),
        (err: Error) => err.message,
      );
      expect(refused).toMatch(/imagegen serve cannot start: .*full-disk\/images cannot be made: its disk is full \(ENOSPC\): free space on it, or set DATA_DIR to a folder on a disk with room\./);
    } finally {
      disk.unmount();
    }
  });

  it('refuses a bad or missing API_KEYS_FILE, saying what to do, before it scans models or starts a worker', async () => {
    const file = path.join(root, 'keys.txt');
    await writeFile(file, 'ops:sk-ops-key speed=3\n');
    const log: string[] = [];
    const refused = await spawnIn(root, { env: { API_KEYS_FILE: file }, onLine: (line) => log.push(line) }).then(
      () => expect.fail('it started'),
      (err: Error) => err.message,
    );
    expect(refused).toMatch(/exited with 1 before listening:\nimagegen serve cannot start: API_KEYS_FILE .*keys\.txt: line 1: 'speed=3' is not a limit/);
    // Nothing of a start was logged: it found the file bad first, not after starting the workers.
    expect(log).toEqual([]);
    // A file not there yet (the flag set before the file was written): it said only 'cannot be read (ENOENT)'.
    const missing = path.join(root, 'no-keys.txt');
    const notThere = await spawnIn(root, { args: ['--api-keys-file', missing] }).then(() => expect.fail('it started'), (err: Error) => err.message);
    expect(notThere).toBe(
      `imagegen serve exited with 1 before listening:\nimagegen serve cannot start: API_KEYS_FILE ${missing}: does not exist: create it, or set API_KEYS_FILE (--api-keys-file) to a file the server may read that holds the keys, one a line as '[label:]key [limit=value ...]' (docs/security.md#keys)\n`,
    );
  });
});

describe('a failing disk', () => {
  it('starts on a DATA_DIR gone read-only, says so in its log at once, and serves the images it stored before (skipped where no tmpfs can be mounted)', async (context) => {
    const dir = path.join(root, 'read-only');
    mkdirSync(dir);
    const mounted = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', dir]);
    if (mounted.status !== 0) return context.skip(`cannot mount a tmpfs (${mounted.stderr?.toString().trim() || mounted.error?.message})`);
    try {
      server = await spawnIn(root, { env: { DATA_DIR: dir } });
      await untilReady(server.origin);
      const answer = await generate(server.baseURL, { response_format: 'url' });
      expect(answer.status).toBe(200);
      const url = answer.body.data![0].url!;
      server.child.kill('SIGTERM');
      expect(await server.exited).toBe(0);

      // The disk remounted read-only (ext4's errors=remount-ro), the server restarted by its supervisor.
      expect(spawnSync('mount', ['-o', 'remount,ro', dir]).status).toBe(0);
      server = await spawnIn(root, { env: { DATA_DIR: dir } });
      // Before any request or probe: it started with its workers' "ready" and not a word of the store.
      await expect
        .poll(() => server!.log.find((line) => line.includes('"level":50')), { timeout: 10_000 })
        .toMatch(/image store: the image folder .*read-only\/images cannot be written \(EROFS\): make it a folder the server's user may write, or set DATA_DIR to one/);
      const image = await fetch(url.replace(/^http:\/\/[^/]+/, server.origin));
      expect([image.status, image.headers.get('content-type')]).toEqual([200, 'image/png']);
      expect((await fetch(`${server.origin}/ready`)).status).toBe(503);
      server.child.kill('SIGTERM');
      expect(await server.exited).toBe(0);
    } finally {
      spawnSync('umount', [dir]);
    }
  });

  it('answers a failed image write with 500 storage_error naming the cause, leaving no partial file', async () => {
    // PNGs of the smallest size take about 7 KiB: every write fails halfway.
    server = await spawnIn(root, { limitsKb: { fileSize: 4 } });
    await untilReady(server.origin);
    const answer = await generate(server.baseURL, { response_format: 'url' });
    expect(answer.status).toBe(500);
    expect(answer.body.error).toMatchObject({ type: 'server_error', code: 'storage_error', param: null });
    expect(answer.body.error!.message).toMatch(/could not save the generated image \(EFBIG\).*b64_json/);
    expect(await images()).toEqual([]);

    expect((await generate(server.baseURL)).status).toBe(200);
    server.child.kill('SIGTERM');
    expect(await server.exited).toBe(0);
  });
});

describe('worker processes', () => {
  /** The pids the server logged for its ready workers. */
  const workerPids = (server: ServerProcess) =>
    server.log.map((line) => JSON.parse(line) as { msg?: string; workerPid?: number }).filter((entry) => entry.msg === 'worker ready').map((entry) => entry.workerPid!);


  it('are what the kernel kills first when memory runs out, rather than the server', async () => {
    server = await spawnIn(root);
    await untilReady(server.origin);
    const score = async (pid: number) => Number(await readFile(`/proc/${pid}/oom_score_adj`, 'utf8'));
    await expect.poll(() => workerPids(server!).length).toBe(1);
    const [worker] = workerPids(server);
    expect(await score(worker)).toBe(Math.min(1000, (await score(server.child.pid!)) + 500));
    server.child.kill('SIGTERM');
    expect(await server.exited).toBe(0);
  });

  it('end with the server: after a graceful shutdown, and when the server itself is killed', async () => {
    for (const signal of ['SIGTERM', 'SIGKILL'] as const) {
      // SIGTERM lets running requests finish for SHUTDOWN_TIMEOUT_SECONDS (tested above): one second here.
      server = await spawnIn(root, { env: { WORKERS: '2', SHUTDOWN_TIMEOUT_SECONDS: '1' } });
      await untilReady(server.origin);
      // The log arrives through a pipe, possibly after /ready answered.
      await expect.poll(() => workerPids(server!).length).toBe(2);
      const pids = workerPids(server);
      for (const pid of pids) expect(await processRuns(pid)).toBe(true);

      // A worker busy with a long generation stops too, when its batch is cancelled rather than when it is done.
      const busy = generate(server.baseURL, { ...LONG, n: 10 }).catch(() => undefined);
      await whenBusy(server.origin);
      server.child.kill(signal);
      await server.exited;
      await busy;
      for (const pid of pids) await expect.poll(() => processRuns(pid), { timeout: 3000, interval: 20 }).toBe(false);
    }
  });
});

describe('serve flags', () => {
  it('take a true/false setting as a switch: the flag alone is true', async () => {
    server = await spawnIn(root, { args: ['--metrics-public', '--log-level', 'info'], env: { API_KEYS: OPS_KEY } });
    // Public metrics: no key needed, where the API needs one.
    expect((await fetch(`${server.origin}/metrics`)).status).toBe(200);
    expect((await fetch(`${server.origin}/v1/models`)).status).toBe(401);
  });
});

describe('HOST and SIGHUP', () => {
  it('listens on an IPv6 address written as in URLs ([::1]), and lives through SIGHUP without keys to reload', async () => {
    server = await spawnIn(root, { env: { HOST: '[::1]', API_KEYS: '' } });
    expect(server.origin).toMatch(/^http:\/\/\[::1\]:\d+$/);
    await untilReady(server.origin);
    // SIGHUP reloads the key file; with none, its default action would end the server.
    server.child.kill('SIGHUP');
    await expect.poll(() => server!.log.some((line) => line.includes('SIGHUP: there are no API keys to reload'))).toBe(true);
    expect((await fetch(`${server.origin}/health`)).status).toBe(200);
    expect(server.child.exitCode).toBeNull();
  });
});

describe.skipIf(!haveOpenssl)('HTTPS (needs openssl to make a certificate)', () => {
  it('serves TLS_CERT and TLS_KEY as HTTPS', async () => {
    const { cert, key } = selfSignedCertificate(root);
    server = await spawnIn(root, { env: { TLS_CERT: cert, TLS_KEY: key } });
    expect(server.origin).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
    const body = await new Promise<string>((resolve, reject) => {
      get(`${server!.origin}/health`, { rejectUnauthorized: false }, (res) => {
        let text = '';
        res.on('data', (chunk: Buffer) => (text += chunk.toString()));
        res.on('end', () => resolve(text));
      }).on('error', reject);
    });
    expect(JSON.parse(body)).toMatchObject({ status: 'ok' });
  });
});
