import { formatBytes } from '../src/util/bytes.js';
import { MemoryFigures } from '../src/models/memory-figures.js';
import { execFile, spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { createHash, randomUUID } from 'node:crypto';
import { chmod, cp, link, mkdir, mkdtemp, readdir, readFile, rename, rm, stat, symlink, truncate, utimes, writeFile } from 'node:fs/promises';
import { createServer as createHttpServer } from 'node:http';
import { createServer, type AddressInfo, type Socket } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, inject, it } from 'vitest';
import { imagegenArgs, PROJECT_ROOT } from './helpers/cli.js';
import { failureOf } from './helpers/failures.js';
import { inspectModel } from '../src/models/layout.js';
import { exists } from '../src/util/files.js';
import { ModelRegistry } from '../src/models/registry.js';
import {
  DownloadInterrupted,
  exportModel,
  importModel,
  listModels,
  MANIFEST_FILE,
  pullModel,
  realDisk,
  removeModel,
  type Disk,
  type PullOptions,
} from '../src/install/index.js';
import { silentLogger } from './helpers/logs.js';
import { ownerHere } from '../src/install/owner.js';
import { FakeHub, readFolderFiles } from './helpers/fake-hub.js';

/**
 * A file's content as its sha256, to compare: vitest's toEqual walks a Buffer byte by byte (seconds for
 * the reference model's weights), and a digest that differs fails on the same damage.
 */
const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');
/** Each file's sha256 by path, to compare folders (readFolderFiles) as sha256 compares files. */
const digests = (files: Record<string, Buffer>) => Object.fromEntries(Object.entries(files).map(([file, data]) => [file, sha256(data)]));

/** This machine as install owners name it (owner.ts: host name and PID namespace), for owners of processes that ran here. */
const machineHere = () => ownerHere().slice(ownerHere().indexOf('@') + 1);

/**
 * `imagegen models`: pulls from a fake Hub (resume, checksums, Hub errors), imports and exports
 * (bundles, manifests, damaged files), list and remove, and a full disk; each failure leaves neither
 * a model nor staging behind.
 */

const execFileAsync = promisify(execFile);
const REPO = 'test-org/sd-turbo-onnx';
const WEIGHTS = 'unet/model.onnx_data';

let hub: FakeHub;
let sourceDir: string;
let sourceFiles: Record<string, Buffer>;
let sourceTotal: number;
/** Half of the weights file: where dropped connections drop. */
let half: number;
let work: string;
let modelsDir: string;
let output: { text: string; write(text: string): boolean; isTTY: false };

beforeAll(async () => {
  sourceDir = path.join(inject('referenceModelsDir'), 'sd-turbo');
  sourceFiles = await readFolderFiles(sourceDir);
  sourceTotal = Object.values(sourceFiles).reduce((sum, data) => sum + data.length, 0);
  half = Math.floor(sourceFiles[WEIGHTS].length / 2);
  hub = await FakeHub.start();
  hub.addRepo(REPO, sourceFiles);
  hub.addRepo('test-org/gated', sourceFiles, { token: 'hf_secret' });
  hub.addRepo('test-org/mixed', {
    ...Object.fromEntries(Object.entries(sourceFiles).map(([file, data]) => [`onnx/${file}`, data])),
    'model_index.json': Buffer.from('{}'),
    'unet/diffusion_pytorch_model.safetensors': Buffer.alloc(4096, 1),
    'sample.png': Buffer.alloc(64, 2),
    // As repositories made for other runtimes ship them: another export of a component beside its model.onnx.
    'onnx/unet/model_fp16.onnx': Buffer.alloc(64, 3),
    'onnx/unet/model_fp16.onnx_data': Buffer.alloc(4096, 4),
  });
  hub.addRepo('test-org/pytorch-only', { 'model_index.json': Buffer.from('{}'), 'unet/diffusion_pytorch_model.safetensors': Buffer.alloc(64) });
  // As NVIDIA's TensorRT repositories ship them: engines compiled for one GPU, no ONNX graphs.
  hub.addRepo('test-org/tensorrt', { 'model_index.json': Buffer.from('{}'), 'unet/unet.plan': Buffer.alloc(64), 'clip/clip.plan': Buffer.alloc(64) });
  // A listing no Hub gives: a path that climbs out of the model's folder.
  hub.addRepo('test-org/escaping', { ...sourceFiles, 'unet/../../../escaped.json': Buffer.from('{}') });
  hub.addRepo('test-org/long-name', { ...sourceFiles, [`unet/${'w'.repeat(300)}`]: Buffer.from('{}') });
  hub.addRepo('test-org/escaping-many', { ...sourceFiles, ...Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [`../escaped-${i}.json`, Buffer.from('{}')])) });
});
afterAll(() => hub.close());

beforeEach(async () => {
  work = await mkdtemp(path.join(os.tmpdir(), 'imagegen-models-'));
  modelsDir = path.join(work, 'models');
  output = { text: '', write: (text) => ((output.text += text), true), isTTY: false };
});
afterEach(() => rm(work, { recursive: true, force: true }));

const pull = (repo: string, options: Partial<PullOptions> = {}) => pullModel({ modelsDir, repo, hubUrl: hub.url, output, retryDelayMs: 0, ...options });
const importFrom = (source: string, name?: string) => importModel({ modelsDir, source, name, output });

/** The real `imagegen` command, as a user runs it, in the project's folder. */
const cli = (...args: string[]) => execFileAsync(process.execPath, imagegenArgs(...args), { cwd: PROJECT_ROOT });

async function registryIds(): Promise<string[]> {
  const registry = new ModelRegistry({ roots: [{ dir: modelsDir, ownedBy: 'user' }], aliases: {}, logger: silentLogger });
  await registry.scan();
  return registry.list().map((model) => model.id);
}

async function expectNoStaging(): Promise<void> {
  expect(await readdir(path.join(modelsDir, '.staging')).catch(() => [])).toEqual([]);
}

/** Neither the model nor anything in the staging area. */
async function expectNothingInstalled(id: string): Promise<void> {
  expect(await exists(path.join(modelsDir, id))).toBe(false);
  await expectNoStaging();
}

/** A copy of the reference model that the test may damage. */
async function copyOfSource(): Promise<string> {
  const dir = path.join(work, 'source-copy');
  await cp(sourceDir, dir, { recursive: true });
  return dir;
}

/** An installed model's folder is as readable as any folder mkdir makes here (the umask's), so a server running as another user can read it. */
async function expectUsualMode(dir: string): Promise<void> {
  const usual = path.join(work, `usual-${Math.random()}`);
  await mkdir(usual);
  expect((await stat(dir)).mode & 0o777).toBe((await stat(usual)).mode & 0o777);
}

describe('models pull', () => {
  it('installs a verified model that the registry serves, reporting byte progress', async () => {
    const model = await pull(REPO);
    expect(model).toMatchObject({ id: 'sd-turbo-onnx', family: 'sd', variant: 'sd-turbo' });
    expect((await inspectModel(model.dir)).variant).toBe('sd-turbo');
    expect(await registryIds()).toEqual(['sd-turbo-onnx']);
    await expectNoStaging();
    await expectUsualMode(model.dir);

    const manifest = JSON.parse(await readFile(path.join(model.dir, MANIFEST_FILE), 'utf8'));
    expect(Object.keys(manifest.files).sort()).toEqual(Object.keys(sourceFiles).sort());
    expect(manifest.source).toEqual({ repo: REPO, revision: 'main', commit: hub.commitOf(REPO) });

    expect(output.text).toContain(`/ ${formatBytes(sourceTotal)}`);
    expect(output.text).toMatch(/100%/);
    // The load check after the download says that it runs (a big model's takes a minute or more).
    expect(output.text).toMatch(/100%.*\nchecking that test-org\/sd-turbo-onnx@main loads \(its ONNX sessions; --skip-load skips this\)\n$/s);
    expect(hub.requests.every((r) => r.authorization === undefined)).toBe(true);
  });

  it('takes only the ONNX export from --subfolder, and of each component only its model.onnx', async () => {
    const model = await pull('test-org/mixed', { subfolder: 'onnx', name: 'mixed' });
    expect(model.variant).toBe('sd-turbo');
    const names = await readdir(model.dir, { recursive: true });
    expect(names.some((name) => /safetensors|png|fp16/.test(String(name)))).toBe(false);
    expect(hub.requests.some((r) => /safetensors|png|fp16/.test(r.path))).toBe(false);
  });

  it('says where the export is, or that there is none, before downloading anything', async () => {
    const before = hub.requests.length;
    await expect(pull('test-org/mixed')).rejects.toThrow(/has no diffusers ONNX export.*--subfolder onnx/);
    await expect(pull('test-org/pytorch-only')).rejects.toThrow(/has no diffusers ONNX export.*PyTorch weights/);
    await expect(pull('test-org/tensorrt')).rejects.toThrow(/has no diffusers ONNX export.*TensorRT engines \(clip\/clip\.plan, unet\/unet\.plan\).*optimum-cli export onnx/);
    expect(hub.requests.slice(before).some((r) => r.path.includes('/resolve/'))).toBe(false);
    await expectNothingInstalled('mixed');
  });

  it('refuses a listing with a path that leaves the model, downloading nothing', async () => {
    const before = hub.requests.length;
    await expect(pull('test-org/escaping')).rejects.toThrow(/listed "unet\/\.\.\/\.\.\/\.\.\/escaped\.json" in test-org\/escaping: not a file path inside it \(or a name too long for a file\)\. Nothing was downloaded/);
    expect(hub.requests.slice(before).some((r) => r.path.includes('/resolve/'))).toBe(false);
    await expectNothingInstalled('escaping');
    expect(await exists(path.join(work, 'escaped.json'))).toBe(false);
  });

  it("sends HF_TOKEN only to the Hub, not to another host that a listing's next page names", async () => {
    const other = hub.url.replace('127.0.0.1', 'localhost');
    const sent: { url: string; authorization: string | null }[] = [];
    const recording: typeof fetch = async (input, init) => {
      const url = input instanceof Request ? input.url : String(input);
      sent.push({ url, authorization: new Headers(init?.headers).get('authorization') });
      const response = await fetch(input, init);
      if (!url.includes('/tree/') || url.startsWith(other)) return response;
      // As a hostile mirror could: the listing's next page on a host of its choosing.
      const headers = new Headers(response.headers);
      headers.set('Link', `<${other}${new URL(url).pathname}?cursor=2>; rel="next"`);
      return new Response(response.body, { status: response.status, headers });
    };
    await pull(REPO, { token: 'hf_secret', fetch: recording, name: 'paged', load: false }).catch(() => undefined);
    expect(sent.filter((r) => r.url.startsWith(other)).map((r) => r.authorization)).toEqual([null]);
    expect(sent.filter((r) => r.url.startsWith(hub.url)).every((r) => r.authorization === 'Bearer hf_secret')).toBe(true);
  });

  it('refuses a listing with a name too long for a file before downloading anything', async () => {
    const before = hub.requests.length;
    await expect(pull('test-org/long-name')).rejects.toThrow(/listed "unet\/w{195}…" in test-org\/long-name: not a file path inside it \(or a name too long for a file\)\. Nothing was downloaded/);
    expect(hub.requests.slice(before).some((r) => r.path.includes('/resolve/'))).toBe(false);
    await expectNothingInstalled('long-name');
  });

  it('names a few of the paths of a listing that holds thousands that leave the model, in a short message', async () => {
    const refusal = await pull('test-org/escaping-many').catch((err: Error) => err);
    expect(String(refusal)).toMatch(/listed "\.\.\/escaped-0\.json", .*"\.\.\/escaped-4\.json" and 1995 more in test-org\/escaping-many: not a file path inside it/);
    expect(String(refusal).length).toBeLessThan(600);
    await expectNothingInstalled('escaping-many');
  });

  it('explains unknown repositories and revisions, and gated ones without HF_TOKEN', async () => {
    await expect(pull('test-org/no-such-model')).rejects.toThrow('repository not found; check the name or set HF_TOKEN for gated/private repos');
    await expect(pull(`${REPO}@no-such-branch`)).rejects.toThrow(`${REPO} has no revision 'no-such-branch'`);
    await expect(pull('not a repo')).rejects.toThrow(/not a Hub repository/);
    // The address of its page, as a browser shows it: the command to run instead, revision and folder included.
    await expect(pull(`https://huggingface.co/${REPO}`)).rejects.toThrow(`'https://huggingface.co/${REPO}' is the address of a Hub page; pull takes the repository: imagegen models pull ${REPO}`);
    await expect(pull(`https://huggingface.co/${REPO}/tree/v2/onnx/`)).rejects.toThrow(`pull takes the repository: imagegen models pull ${REPO}@v2 --subfolder onnx`);
    // A file's page names the folder it is in, not the file as a folder.
    await expect(pull(`https://huggingface.co/${REPO}/blob/main/onnx/unet/model.onnx`)).rejects.toThrow(new RegExp(`pull takes the repository: imagegen models pull ${REPO} --subfolder onnx/unet$`));
    await expect(pull(`https://huggingface.co/${REPO}/resolve/main/model_index.json`)).rejects.toThrow(new RegExp(`pull takes the repository: imagegen models pull ${REPO}$`));
    await expect(pull(`http://mirror.example.com:8080/${REPO}/tree/main`)).rejects.toThrow(`pull takes the repository: imagegen models pull ${REPO} --hub-url http://mirror.example.com:8080`);
    await expect(pull('test-org/gated')).rejects.toThrow(/gated or private.*set HF_TOKEN/);
    await expectNothingInstalled('gated');
    expect((await pull('test-org/gated', { token: 'hf_secret' })).id).toBe('gated');
  });

  it('explains a Hub that cannot be reached', async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const hubUrl = `http://127.0.0.1:${(closed.address() as AddressInfo).port}`;
    await new Promise((resolve) => closed.close(resolve));
    await expect(pull(REPO, { hubUrl })).rejects.toThrow(
      new RegExp(`cannot reach the Hub at ${hubUrl} .*ECONNREFUSED.*on a machine that has it run "imagegen models pull ${REPO}" .*"huggingface-cli download ${REPO} --local-dir <folder>".*"imagegen models import <bundle or folder>"`),
    );
  });

  it("refuses to pull with HF_HUB_OFFLINE on, as Hugging Face's tools do, asking nothing of the Hub or a mirror", async () => {
    // Before, the variable air-gapped sites set was ignored: the pull went to the network (or the mirror) regardless.
    const asked = hub.requests.length;
    const offline = execFileAsync(process.execPath, imagegenArgs('models', 'pull', REPO, '--models-dir', modelsDir), {
      cwd: PROJECT_ROOT,
      env: { ...process.env, HF_ENDPOINT: hub.url, HF_HUB_OFFLINE: 'TRUE' },
    });
    await expect(offline).rejects.toMatchObject({
      code: 2,
      stderr: expect.stringMatching(new RegExp(`^error: HF_HUB_OFFLINE is TRUE, so pull asks nothing of the Hub or of a mirror \\(HF_ENDPOINT\\): unset it to pull ${REPO}, or, .*"imagegen models import <bundle or folder>"\\n$`)),
    });
    expect(hub.requests.length).toBe(asked);
    await expectNothingInstalled('sd-turbo-onnx');
    // Off (0, false, unset) pulls as ever.
    expect((await pull(REPO, { offline: '0' })).id).toBe('sd-turbo-onnx');
  });

  it('gives up on a server that takes the connection and never answers, and explains one that is not a Hub', async () => {
    // Takes connections and never says a word.
    const sockets: Socket[] = [];
    const silent = createServer((socket) => void sockets.push(socket));
    const portal = createHttpServer((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html>Sign in to the proxy</html>'));
    // JSON, but not the Hub's: no commit in the model info; or a commit, and a file tree that is no list.
    const json = (body: (url: string) => object) => createHttpServer((req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body(req.url ?? ''))));
    const noCommit = json(() => ({}));
    const noTree = json((url) => (url.includes('/tree/') ? {} : { id: REPO, sha: 'a'.repeat(40) }));
    const urls = await Promise.all(
      [silent, portal, noCommit, noTree].map(async (server) => {
        await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
        return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      }),
    );
    try {
      await expect(pull(REPO, { hubUrl: urls[0], stallMs: 300 })).rejects.toThrow(new RegExp(`cannot reach the Hub at ${urls[0]} \\(no answer from the server for 0.3 s\\)`));
      await expect(pull(REPO, { hubUrl: urls[1] })).rejects.toThrow(new RegExp(`the server at ${urls[1]} did not answer as a Hugging Face Hub does .*check HF_ENDPOINT`));
      await expect(pull(REPO, { hubUrl: urls[2] })).rejects.toThrow(new RegExp(`the server at ${urls[2]} did not answer as a Hugging Face Hub does \\(its model info for ${REPO} has no commit id \\(sha\\)\\)`));
      await expect(pull(REPO, { hubUrl: urls[3] })).rejects.toThrow(new RegExp(`the server at ${urls[3]} did not answer as a Hugging Face Hub does`));
      await expectNothingInstalled('sd-turbo-onnx');
    } finally {
      for (const socket of sockets) socket.destroy();
      for (const server of [portal, noCommit, noTree]) server.closeAllConnections();
      await Promise.all([silent, portal, noCommit, noTree].map((server) => new Promise((resolve) => server.close(resolve))));
    }
  });

  it('keeps a download whose connection dropped, and resumes it with a Range request', async () => {
    hub.dropOnce(REPO, WEIGHTS, half);
    const failure = await failureOf(pull(REPO, { retries: 0 }));
    expect(failure).toBeInstanceOf(DownloadInterrupted);
    expect(failure.message).toMatch(new RegExp(`while downloading ${WEIGHTS}.*Run the same command again to resume`));
    expect(await exists(path.join(modelsDir, 'sd-turbo-onnx'))).toBe(false);
    expect(await listModels(modelsDir)).toMatchObject([{ id: 'sd-turbo-onnx', status: 'partial' }]);

    const before = hub.downloadsOf(REPO, WEIGHTS).length;
    await pull(REPO);
    const resumed = hub.downloadsOf(REPO, WEIGHTS).slice(before);
    expect(resumed.map((r) => r.range)).toContain(`bytes=${half}-`);
    expect(output.text).toContain('resuming');
    expect((await inspectModel(path.join(modelsDir, 'sd-turbo-onnx'))).variant).toBe('sd-turbo');
    await expectNoStaging();
  });

  it.each([
    ['not JSON', '{"repo": "test-org/sd-turbo-onnx", "files": {', /pull\.json is not valid JSON/],
    ['without its files', JSON.stringify({ repo: REPO, subfolder: '' }), /pull\.json is not a pull's record \(files: /],
    ['with files of the wrong types', JSON.stringify({ repo: REPO, subfolder: '', files: { [WEIGHTS]: 7 } }), /pull\.json is not a pull's record \(files\.unet\/model\.onnx_data: /],
  ])("starts an interrupted pull over, saying so, when the record it kept is %s", async (_, record, reason) => {
    hub.dropOnce(REPO, WEIGHTS, half);
    await expect(pull(REPO, { retries: 0 })).rejects.toThrow(DownloadInterrupted);
    await writeFile(path.join(modelsDir, '.staging', 'pull-sd-turbo-onnx', 'pull.json'), record);
    const before = hub.downloadsOf(REPO, WEIGHTS).length;
    const model = await pull(REPO, { load: false });
    expect(output.text).toMatch(reason);
    expect(output.text).toContain('starting it over');
    expect(hub.downloadsOf(REPO, WEIGHTS).slice(before).every((r) => r.range === undefined)).toBe(true);
    expect((await readFile(path.join(model.dir, WEIGHTS))).equals(sourceFiles[WEIGHTS])).toBe(true);
    await expectNoStaging();
  });

  it('starts a file over when it changed on the Hub since the interrupted pull', async () => {
    const repo = 'test-org/changing';
    hub.addRepo(repo, sourceFiles);
    hub.dropOnce(repo, WEIGHTS, half);
    await expect(pull(repo, { retries: 0 })).rejects.toThrow(DownloadInterrupted);
    const changed = Buffer.from(sourceFiles[WEIGHTS]);
    changed[0] ^= 1;
    hub.addRepo(repo, { ...sourceFiles, [WEIGHTS]: changed });
    const before = hub.downloadsOf(repo, WEIGHTS).length;
    const model = await pull(repo);
    expect(hub.downloadsOf(repo, WEIGHTS).slice(before).every((r) => r.range === undefined)).toBe(true);
    expect((await readFile(path.join(model.dir, WEIGHTS))).equals(changed)).toBe(true);
  });

  it('retries a dropped connection by itself', async () => {
    hub.dropOnce(REPO, WEIGHTS, half);
    const before = hub.downloadsOf(REPO, WEIGHTS).length;
    await pull(REPO, { retries: 1 });
    expect(hub.downloadsOf(REPO, WEIGHTS).slice(before).map((r) => r.range)).toContain(`bytes=${half}-`);
    expect(output.text).toMatch(/connection dropped while downloading .*retry 1 of 1/);
  });

  it.each([429, 503])('retries a download the Hub answers %i for a moment, as it does a dropped connection', async (status) => {
    hub.failOnce(REPO, WEIGHTS, status);
    const model = await pull(REPO, { retries: 1, load: false });
    expect(output.text).toMatch(new RegExp(`while downloading ${WEIGHTS} \\(the server answered ${status} .*retry 1 of 1`));
    expect((await readFile(path.join(model.dir, WEIGHTS))).equals(sourceFiles[WEIGHTS])).toBe(true);
  });

  it('starts a file over when a resumed download comes whole (a proxy that ignores Range), rather than appending it to what had arrived', async () => {
    hub.dropOnce(REPO, WEIGHTS, half);
    await expect(pull(REPO, { retries: 0 })).rejects.toThrow(DownloadInterrupted);
    hub.ignoreRangeOnce(REPO, WEIGHTS);
    const model = await pull(REPO, { load: false });
    expect((await readFile(path.join(model.dir, WEIGHTS))).equals(sourceFiles[WEIGHTS])).toBe(true);
  });

  it.each([
    ['an LFS file', WEIGHTS, /sha256 is [0-9a-f]{64}, expected/],
    ['a git file', 'scheduler/scheduler_config.json', /git blob id is [0-9a-f]{40}, expected/],
  ])('refuses %s whose checksum does not match the listing, leaving nothing behind', async (_, file, mismatch) => {
    const repo = `test-org/bad-${file.replace(/\W/g, '-')}`;
    hub.addRepo(repo, sourceFiles);
    hub.reportWrongChecksum(repo, file);
    const failure = await failureOf(pull(repo, { name: 'bad' }));
    expect(failure.message).toContain(`${file} failed verification`);
    expect(failure.message).toMatch(mismatch);
    expect(failure.message).toContain('Run the pull again');
    await expectNothingInstalled('bad');
  });

  it("prints the name of a repository's file without its control characters when its download drops or fails verification", async () => {
    // A file anyone can put in a Hub repository beside its graph: every file there is downloaded.
    const repo = 'test-org/control-characters';
    const file = 'unet/\x1b]0;pwned\x07\x1b[2J\u009b31m\u202enotes.json';
    const shown = 'unet/\\u001b]0;pwned\\u0007\\u001b[2J\\u009b31m\\u202enotes.json';
    const control = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/;
    const notes = Buffer.from('{"notes": "a file that is not part of the export"}');
    hub.addRepo(repo, { ...sourceFiles, [file]: notes });
    const messages: string[] = [];
    // Dropped, then resumed: the note of the retry.
    hub.dropOnce(repo, file, 10);
    await pull(repo, { name: 'retried', retries: 1, load: false });
    messages.push(output.text.split('\n').find((line) => line.includes('connection dropped while downloading'))!);
    // Dropped for good.
    hub.dropOnce(repo, file, 10);
    messages.push((await failureOf(pull(repo, { name: 'dropped', retries: 0 }))).message);
    // Longer than its listing, then a checksum that does not match it.
    hub.lengthenOnce(repo, file, 10);
    messages.push((await failureOf(pull(repo, { name: 'long' }))).message);
    hub.reportWrongChecksum(repo, file);
    messages.push((await failureOf(pull(repo, { name: 'checksum' }))).message);
    const starts = [
      `connection dropped while downloading ${shown} (`,
      `the connection dropped while downloading ${shown} (`,
      `${shown} failed verification: ${hub.url} sent more than the ${notes.length} bytes its listing gives.`,
      `${shown} failed verification: its git blob id is`,
    ];
    expect(messages.map((message, i) => message.slice(0, starts[i].length))).toEqual(starts);
    for (const message of messages) expect(message).not.toMatch(control);
  });

  it('lets one pull of a model run at a time, takes over the lock of a killed one, and refuses to remove a model being pulled', async () => {
    const twice = await Promise.allSettled([pull(REPO, { load: false }), pull(REPO, { load: false })]);
    expect(twice.map((result) => result.status).sort()).toEqual(['fulfilled', 'rejected']);
    const refused = twice.find((result) => result.status === 'rejected')!;
    expect(String(refused.reason)).toMatch(/another "imagegen models pull" of 'sd-turbo-onnx' is running \(process \d+@.+\); wait for it to finish/);
    expect(digests(await readFolderFiles(path.join(modelsDir, 'sd-turbo-onnx')))).toMatchObject(digests(sourceFiles));
    await expectNoStaging();

    // A pull killed with -9 leaves its lock; the next one takes it over.
    const { stdout } = await execFileAsync(process.execPath, ['-p', 'process.pid']);
    await writeFile(path.join(modelsDir, '.staging', 'lock-again'), `${stdout.trim()}@${machineHere()}`);
    expect((await pull(REPO, { load: false, name: 'again' })).id).toBe('again');
    await expectNoStaging();

    await writeFile(path.join(modelsDir, '.staging', 'lock-again'), `${process.pid}@${machineHere()}`);
    await expect(removeModel(modelsDir, 'again')).rejects.toThrow(/another "imagegen models pull" of 'again' is running .*; stop it first, then remove 'again'/);
    expect(await exists(path.join(modelsDir, 'again'))).toBe(true);
  });

  it.runIf(process.platform !== 'win32')("removes the lock's draft of a pull killed while taking the lock", async () => {
    // The lock a FIFO: the taker's read of its owner waits there, after the draft is written and before it is deleted.
    const staging = path.join(modelsDir, '.staging');
    const lock = path.join(staging, 'lock-drafted');
    await mkdir(staging, { recursive: true });
    await execFileAsync('mkfifo', [lock]);
    const owner = pathToFileURL(path.join(PROJECT_ROOT, 'dist/install/owner.js')).href;
    const taker = spawn(process.execPath, ['--input-type=module', '-e', `(await import(${JSON.stringify(owner)})).takeLock(process.argv[1])`, lock]);
    const exited = once(taker, 'exit');
    await expect.poll(() => readdir(staging), { timeout: 10_000 }).toHaveLength(2);
    taker.kill('SIGKILL');
    await exited;
    await rm(lock);

    await pull(REPO, { load: false, name: 'drafted' });
    await expectNoStaging();
  });

  it('refuses to replace a model without --force, and replaces it with', async () => {
    await pull(REPO, { name: 'turbo' });
    await expect(pull(REPO, { name: 'turbo' })).rejects.toThrow("a model 'turbo' already exists");
    await pull(REPO, { name: 'turbo', force: true });
    expect(await registryIds()).toEqual(['turbo']);
    await expectNoStaging();
  });
});

describe('models import and export', () => {
  it('round-trips a folder through an export bundle', async () => {
    const imported = await importFrom(sourceDir, 'imported');
    expect(imported.variant).toBe('sd-turbo');
    expect(output.text).toContain(`checking that ${sourceDir} loads`);
    await expectUsualMode(imported.dir);
    const out = path.join(work, 'out');
    await mkdir(out);
    const bundle = await exportModel({ modelsDir, id: 'imported', out, output });
    expect(bundle.file).toBe(path.join(out, 'imported.tar'));

    // Standard tools read it, so it can be inspected or unpacked by hand.
    const { stdout } = await execFileAsync('tar', ['tf', bundle.file]);
    expect(stdout.split('\n')).toEqual(expect.arrayContaining(['imported/unet/model.onnx', `imported/${MANIFEST_FILE}`]));

    await removeModel(modelsDir, 'imported');
    const again = await importFrom(bundle.file);
    expect(again.id).toBe('imported');
    expect(await registryIds()).toEqual(['imported']);
    const manifest = JSON.parse(await readFile(path.join(again.dir, MANIFEST_FILE), 'utf8'));
    expect(Object.keys(manifest.files)).toContain(WEIGHTS);
    await expectNoStaging();
  });

  it('removes the staging folders that a killed import left, and not those of one still running', async () => {
    const { stdout } = await execFileAsync(process.execPath, ['-p', 'process.pid']);
    const staging = path.join(modelsDir, '.staging');
    const killed = path.join(staging, `import-other+${stdout.trim()}@${machineHere()}+${randomUUID()}`);
    const running = path.join(staging, `import-other+${process.pid}@${machineHere()}+${randomUUID()}`);
    const elsewhere = path.join(staging, `replaced-other+${stdout.trim()}@another-host+${randomUUID()}`);
    for (const dir of [killed, running, elsewhere]) await mkdir(path.join(dir, 'unet'), { recursive: true });
    await writeFile(path.join(killed, 'unet', 'model.onnx'), Buffer.alloc(1024));

    await importFrom(sourceDir, 'fresh');
    expect((await readdir(staging)).sort()).toEqual([path.basename(elsewhere), path.basename(running)].sort());
  });

  it('puts back the model that a replace killed between its two renames had moved aside, where its id names no model', async () => {
    const { stdout } = await execFileAsync(process.execPath, ['-p', 'process.pid']);
    const staging = path.join(modelsDir, '.staging');
    await importFrom(sourceDir, 'kept');
    await importFrom(sourceDir, 'other');
    // As installStaged leaves them: `kept` moved aside and the kill came before the new model took its place; `other` moved aside and replaced.
    const aside = (id: string) => path.join(staging, `replaced-${id}+${stdout.trim()}@${machineHere()}+${randomUUID()}`);
    await rename(path.join(modelsDir, 'kept'), aside('kept'));
    await cp(path.join(modelsDir, 'other'), aside('other'), { recursive: true });
    expect(await registryIds()).toEqual(['other']);

    await importFrom(sourceDir, 'fresh');
    // Deleted, the old model was lost for good: its id named nothing, and the new one had been deleted by Ctrl-C's exit hook.
    expect((await registryIds()).sort()).toEqual(['fresh', 'kept', 'other']);
    await expectNoStaging();
  });

  it("removes what a killed install of a version before owners were named left, once it has gone unwritten for an hour", async () => {
    const staging = path.join(modelsDir, '.staging');
    // As versions 2dd6c67 (mkdtemp's six characters) and 7f381cf (a UUID) named an import's half copy and a model moved aside.
    const leftovers = [`import-other-Ab3xZ9`, `import-other-${randomUUID()}`, `replaced-other-${randomUUID()}`, `removing-other-${randomUUID()}`].map((name) => path.join(staging, name));
    const recent = path.join(staging, `import-other-${randomUUID()}`);
    const twoHoursAgo = new Date(Date.now() - 2 * 3600_000);
    for (const dir of [...leftovers, recent]) {
      await mkdir(path.join(dir, 'unet'), { recursive: true });
      await writeFile(path.join(dir, 'unet', 'model.onnx'), Buffer.alloc(1024));
    }
    for (const dir of leftovers) for (const entry of [path.join(dir, 'unet', 'model.onnx'), path.join(dir, 'unet'), dir]) await utimes(entry, twoHoursAgo, twoHoursAgo);

    await importFrom(sourceDir, 'fresh');
    // One written within the hour may be an older version's install running on another machine that shares the folder.
    expect(await readdir(staging)).toEqual([path.basename(recent)]);
  });

  it('refuses a folder with a damaged ONNX file', async () => {
    const dir = await copyOfSource();
    await writeFile(path.join(dir, 'unet', 'model.onnx'), Buffer.from('this is not a protobuf, just garbage bytes'));
    await expect(importFrom(dir, 'damaged')).rejects.toThrow(new RegExp(`${dir} is not a usable model folder: unet/model.onnx is cut short or is not an ONNX graph .*Nothing was installed`));
    await expectNothingInstalled('damaged');
  });

  it('refuses an empty ONNX file even with --skip-load, and lists a model holding one as broken', async () => {
    // What a copy that failed before its first byte leaves: an empty file is a protobuf of no fields, which onnxruntime refuses only as a request loads it.
    const dir = await copyOfSource();
    await truncate(path.join(dir, 'unet', 'model.onnx'), 0);
    const empty = /unet\/model\.onnx is cut short or is not an ONNX graph \(it holds no graph\): copy it again from the export/;
    await expect(cli('models', 'import', dir, '--name', 'empty', '--skip-load', '--models-dir', modelsDir)).rejects.toMatchObject({ code: 1, stderr: expect.stringMatching(empty) });
    await expectNothingInstalled('empty');
    // One that was installed before, or damaged in place since.
    await importFrom(sourceDir, 'emptied');
    await truncate(path.join(modelsDir, 'emptied', 'unet', 'model.onnx'), 0);
    expect((await cli('models', 'list', '--models-dir', modelsDir)).stdout).toMatch(new RegExp(`\\nemptied\\s.*broken: ${empty.source}`));
  });

  it("refuses a models folder that is a model's folder, where no server would find what it installs, before copying or downloading anything, and removes none of its parts", async () => {
    const model = await importFrom(sourceDir, 'turbo');
    const parts = (await readdir(model.dir)).sort();
    const inside = /the models folder .*turbo is a model folder itself \(it has model_index\.json; its sub-folders are that model's parts\): point MODELS_DIR at the folder that holds model folders/;
    // It installed 'other' as <models>/turbo/other, with a staging folder beside the model's parts.
    await expect(importModel({ modelsDir: model.dir, source: sourceDir, name: 'other', output })).rejects.toThrow(inside);
    await expect(pullModel({ modelsDir: model.dir, repo: REPO, hubUrl: hub.url, output })).rejects.toThrow(inside);
    // And removes none of its parts as if they were models: 'models remove unet' deleted the model's UNet.
    await expect(removeModel(model.dir, 'unet')).rejects.toThrow(inside);
    expect((await readdir(model.dir)).sort()).toEqual(parts);
  });

  it('refuses a folder that is missing or is not a model', async () => {
    await expect(importFrom(path.join(work, 'nowhere'))).rejects.toThrow(/does not exist; give the path of a model folder/);
    const dir = await copyOfSource();
    await rm(path.join(dir, 'text_encoder'), { recursive: true });
    await expect(importFrom(dir, 'partial')).rejects.toThrow(/missing text_encoder\/model.onnx.*Copy the complete export folder again/);
    await expectNothingInstalled('partial');
    // Refused by its layout before any of it is copied: an incomplete export of gigabytes is not copied first.
    expect(output.text).not.toContain('copying');
    // A mistake in our own preset file is to be corrected there, not copied again.
    const preset = await copyOfSource();
    await writeFile(path.join(preset, 'imagegen.json'), '{"sizes": ["500x500"]}');
    await expect(importFrom(preset, 'preset')).rejects.toThrow(/imagegen\.json: sizes 500x500 do not fit.*Correct imagegen\.json in .*or remove it/);
    await expectNothingInstalled('preset');
  });

  it('says what to do about a folder it refuses once, in words that fit the reason: a damaged file is copied again, a missing one is no damage', async () => {
    const importCli = (dir: string) => cli('models', 'import', dir, '--skip-load', '--models-dir', modelsDir);
    // A missing scheduler config was 'damaged or truncated', in a note about 'a file that cannot be loaded'.
    const dir = await copyOfSource();
    await rm(path.join(dir, 'scheduler', 'scheduler_config.json'));
    await expect(importCli(dir)).rejects.toMatchObject({
      code: 1,
      stderr: `error: ${dir} is not a usable model folder: missing scheduler/scheduler_config.json. Nothing was installed. Copy the complete export folder again\n`,
    });
    // A graph cut short said 'copy it again from the export', then 'Copy the complete export folder again (... damaged or truncated)'.
    await cp(path.join(sourceDir, 'scheduler'), path.join(dir, 'scheduler'), { recursive: true });
    await truncate(path.join(dir, 'vae_decoder', 'model.onnx'), 100);
    await expect(importCli(dir)).rejects.toMatchObject({
      code: 1,
      stderr: expect.stringMatching(/vae_decoder\/model\.onnx is cut short or is not an ONNX graph \(.+\): copy it again from the export\. Nothing was installed\n$/),
    });
    await expectNothingInstalled(path.basename(dir));
    // Whatever names a refusal quotes (a folder's, a bundle's or its manifest's entries: text a model's
    // publisher wrote) reaches the terminal without control sequences: an ESC here cleared the screen.
    const unpacked = path.join(work, 'unpacked \x1b[2J\x1b]0;pwned\x07\u009b31m\u202eexport');
    await mkdir(unpacked);
    const refused = await importCli(unpacked).catch((err: { stderr: string }) => err.stderr);
    expect(refused).toContain('unpacked \\u001b[2J\\u001b]0;pwned\\u0007\\u009b31m\\u202eexport has no diffusers ONNX export');
    expect(refused).not.toMatch(/[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/);
  });

  it('says where the exports are in a folder that holds them deeper, or that it holds none, before copying anything', async () => {
    const parent = path.join(work, 'exports');
    for (const name of ['sd15', 'sdxl']) await cp(sourceDir, path.join(parent, name), { recursive: true });
    await expect(importFrom(parent)).rejects.toThrow(
      `${parent} has no diffusers ONNX export (no unet/model.onnx or transformer/model.onnx); pick the export's folder: imagegen models import ${parent}/sd15 or imagegen models import ${parent}/sdxl`,
    );
    const weightsOnly = path.join(work, 'pytorch');
    await mkdir(path.join(weightsOnly, 'unet'), { recursive: true });
    await writeFile(path.join(weightsOnly, 'model_index.json'), '{}');
    await writeFile(path.join(weightsOnly, 'unet', 'diffusion_pytorch_model.safetensors'), Buffer.alloc(64));
    await expect(importFrom(weightsOnly)).rejects.toThrow(/has no diffusers ONNX export.*give the export's own folder.*optimum-cli export onnx/);
    expect(output.text).not.toContain('copying');
    expect(await exists(modelsDir)).toBe(false);
    // Whatever the folder's name: one that is no model id ("My exports") was told to choose an id with --name,
    // one named as an installed model to pass --force, and only then where the exports are.
    const named = path.join(work, 'My exports (old)');
    await cp(parent, named, { recursive: true });
    await expect(importFrom(named)).rejects.toThrow(`${named} has no diffusers ONNX export`);
    await importFrom(sourceDir, 'exports');
    await expect(importFrom(parent)).rejects.toThrow(`${parent} has no diffusers ONNX export`);
  });

  it('follows symbolic links, and names a link loop or a link to nothing instead of walking it until the path is too long', async () => {
    // As a Hugging Face cache's snapshot is: files that are links to blobs elsewhere.
    const linked = await copyOfSource();
    const blobs = path.join(work, 'blobs');
    await mkdir(blobs);
    await cp(path.join(linked, WEIGHTS), path.join(blobs, 'unet-weights'));
    await rm(path.join(linked, WEIGHTS));
    await symlink(path.join(blobs, 'unet-weights'), path.join(linked, WEIGHTS));
    expect((await importFrom(linked, 'linked')).id).toBe('linked');

    await symlink('..', path.join(linked, 'unet', 'up'));
    await expect(importFrom(linked, 'looped')).rejects.toThrow(new RegExp(`${linked}/unet/up leads to a folder already listed \\(a symbolic link loop`));
    await rm(path.join(linked, 'unet', 'up'));
    await symlink('l2', path.join(linked, 'l1'));
    await symlink('l1', path.join(linked, 'l2'));
    await expect(importFrom(linked, 'looped')).rejects.toThrow(new RegExp(`${linked}/l1 is a symbolic link to nothing that can be read \\(ELOOP\\): remove it`));
    await expectNothingInstalled('looped');
  });

  it('refuses an id too long for a folder name, a folder --out that does not exist, and an --out named as compressed, before any work', async () => {
    await expect(importFrom(sourceDir, 'x'.repeat(300))).rejects.toThrow(/^'x{40}…' \(300 characters\) is not a valid model id: use up to 128 letters/);
    await expectNothingInstalled('x'.repeat(128));
    expect((await importFrom(sourceDir, 'y'.repeat(128))).id).toBe('y'.repeat(128));

    await importFrom(sourceDir, 'good');
    const missing = path.join(work, 'no-such-folder') + path.sep;
    await expect(exportModel({ modelsDir, id: 'good', out: missing, output })).rejects.toThrow(`the folder ${missing} does not exist; create it, or give the bundle file's name as --out`);
    expect(await exists(path.join(work, 'no-such-folder'))).toBe(false);
    // A name that promises compression would hold a plain tar, which `tar xzf` refuses.
    for (const name of ['good.tar.gz', 'good.tgz', 'good.zip']) {
      await expect(exportModel({ modelsDir, id: 'good', out: path.join(work, name), output })).rejects.toThrow(`${path.join(work, name)} is named as a ${name.split('.').pop()} file, but a bundle is an uncompressed tar`);
    }
    await expect(exportModel({ modelsDir, id: 'good', out: path.join(work, 'good.tar.gz'), output })).rejects.toThrow(`name it ${path.join(work, 'good')}.tar,`);
    expect(await exists(path.join(work, 'good.tar.gz'))).toBe(false);
  });

  it('refuses files that do not match the manifest', async () => {
    await importFrom(sourceDir, 'good');
    const dir = await copyOfSource();
    const manifest = JSON.parse(await readFile(path.join(modelsDir, 'good', MANIFEST_FILE), 'utf8'));
    await writeFile(path.join(dir, MANIFEST_FILE), JSON.stringify(manifest));
    await writeFile(path.join(dir, 'tokenizer', 'tokenizer_config.json'), '{"changed": true}');
    await expect(importFrom(dir, 'tampered')).rejects.toThrow(/tokenizer\/tokenizer_config.json failed verification.*differs from the manifest/);

    await writeFile(path.join(dir, 'extra.onnx'), 'x');
    await expect(importFrom(dir, 'tampered')).rejects.toThrow(/not listed in the manifest: extra.onnx/);
    await expectNothingInstalled('tampered');
  });

  it("carries presets edited in the installed model's folder (imagegen.json, which the manifest does not vouch for) through export and the import of a copied folder", async () => {
    const preset = await copyOfSource();
    await writeFile(path.join(preset, 'imagegen.json'), '{"max_batch": 2}');
    const installed = (await importFrom(preset, 'tuned')).dir;
    // What docs/api.md has the operator do: tune the presets in the installed folder.
    const tuned = '{"max_batch": 4, "sizes": ["512x512", "256x256"]}';
    await writeFile(path.join(installed, 'imagegen.json'), tuned);
    const { file } = await exportModel({ modelsDir, id: 'tuned', out: path.join(work, 'tuned.tar'), output });
    expect(JSON.parse(await readFile(path.join((await importModel({ modelsDir, source: file, name: 'carried', output, load: false })).dir, 'imagegen.json'), 'utf8'))).toEqual(JSON.parse(tuned));
    // Presets tuned wrong are refused before a bundle is written, saying what was not done: before, an export said "Nothing was installed".
    await writeFile(path.join(installed, 'imagegen.json'), '{"max_batch": 0}');
    await expect(exportModel({ modelsDir, id: 'tuned', out: path.join(work, 'wrong.tar'), output })).rejects.toThrow(
      `${installed} is not a usable model folder: imagegen.json: max_batch: Too small: expected number to be >=1. Nothing was exported. Correct imagegen.json in ${installed}`,
    );
    expect(await exists(path.join(work, 'wrong.tar'))).toBe(false);
    // Edited by hand into no JSON (a trailing comma): said where, and to correct it, where it sent the operator to pull or import the model again.
    await writeFile(path.join(installed, 'imagegen.json'), '{\n  "max_batch": 4,\n}\n');
    await expect(exportModel({ modelsDir, id: 'tuned', out: path.join(work, 'wrong.tar'), output })).rejects.toThrow(
      /is not a usable model folder: imagegen\.json: not valid JSON \(.*line 3 column 1: a comma before the closing bracket, which JSON does not allow: remove it\)\. Nothing was exported\. Correct imagegen\.json in /,
    );
    await writeFile(path.join(installed, 'imagegen.json'), tuned);

    // An installed folder copied to another site as it is, its presets changed, added or removed since its install.
    const copied = path.join(work, 'copied');
    await cp(installed, copied, { recursive: true });
    await writeFile(path.join(copied, 'imagegen.json'), '{"max_batch": 8}');
    expect((await importModel({ modelsDir, source: copied, name: 'copied', output, load: false })).id).toBe('copied');
    await rm(path.join(copied, 'imagegen.json'));
    expect((await importModel({ modelsDir, source: copied, name: 'no-preset', output, load: false })).id).toBe('no-preset');
    await cp(path.join(modelsDir, 'no-preset'), path.join(work, 'added'), { recursive: true });
    await writeFile(path.join(work, 'added', 'imagegen.json'), '{"max_batch": 1}');
    expect((await importModel({ modelsDir, source: path.join(work, 'added'), name: 'added', output, load: false })).id).toBe('added');
    // The export's own files are still held to it.
    await writeFile(path.join(copied, 'tokenizer', 'tokenizer_config.json'), '{"changed": true}');
    await expect(importModel({ modelsDir, source: copied, name: 'tampered', output, load: false })).rejects.toThrow(/tokenizer\/tokenizer_config.json failed verification/);
    await writeFile(path.join(installed, 'tokenizer', 'tokenizer_config.json'), '{"changed": true}');
    await expect(exportModel({ modelsDir, id: 'tuned', out: path.join(work, 'tampered.tar'), output })).rejects.toThrow(/tokenizer\/tokenizer_config.json failed verification/);
  });

  it('refuses damaged and truncated bundles', async () => {
    await importFrom(sourceDir, 'good');
    const { file } = await exportModel({ modelsDir, id: 'good', out: path.join(work, 'good.tar'), output });
    const bytes = await readFile(file);
    const damaged = path.join(work, 'damaged.tar');
    const weightsAt = bytes.indexOf(Buffer.from(`good/${WEIGHTS}`)) + 512 + 1000;
    bytes[weightsAt] ^= 0xff;
    await writeFile(damaged, bytes);
    await expect(importFrom(damaged, 'damaged')).rejects.toThrow(new RegExp(`${WEIGHTS} failed verification: its sha256`));

    // A second copy of a file appended, as `tar rf` does: tar would unpack the later one.
    const appended = path.join(work, 'appended.tar');
    await cp(file, appended);
    await mkdir(path.join(work, 'again', 'good', 'tokenizer'), { recursive: true });
    await writeFile(path.join(work, 'again', 'good', 'tokenizer', 'tokenizer_config.json'), '{"changed": true}');
    await execFileAsync('tar', ['rf', appended, '-C', path.join(work, 'again'), 'good/tokenizer/tokenizer_config.json']);
    await expect(importModel({ modelsDir, source: appended, name: 'appended', output, load: false })).rejects.toThrow(/not a readable bundle \(good\/tokenizer\/tokenizer_config.json is in it twice\)/);

    await truncate(file, 100_000);
    await expect(importFrom(file, 'truncated')).rejects.toThrow(/not a readable bundle.*truncated or damaged/);
    // One of a model's files given for its folder is no damaged bundle, to be copied again.
    for (const inside of ['model_index.json', 'unet/model.onnx', 'unet/config.json']) {
      await expect(importFrom(path.join(sourceDir, inside), 'a-file')).rejects.toThrow(
        `${path.join(sourceDir, inside)} is neither a model folder nor a bundle (a tar, as "imagegen models export" writes one): give the model's folder (the one that holds model_index.json and unet/ or transformer/) rather than a file in it, or a bundle`,
      );
    }
    await expectNothingInstalled('a-file');
    await expectNothingInstalled('damaged');
    await expectNothingInstalled('appended');
    await expectNothingInstalled('truncated');
  });

  it("imports a tar of an export folder made by GNU tar's default format: long names, and sizes of 8 GiB and more", async () => {
    // A long id makes paths over 100 bytes, which GNU tar writes as 'L' entries holding the next one's name.
    const id = `sdxl-turbo-${'x'.repeat(90)}`;
    await cp(sourceDir, path.join(work, id), { recursive: true });
    const archive = path.join(work, 'gnu.tar');
    await execFileAsync('tar', ['--format=gnu', '-cf', archive, '-C', work, id]);
    const bytes = await readFile(archive);
    expect(bytes.includes(Buffer.from('././@LongLink'))).toBe(true);

    // GNU tar gives a file of 8 GiB or more (an SDXL UNet's or FLUX's weights) its size in base-256, which
    // no small test file gets: the weights' header rewritten so, as GNU tar reads it (tar tvf below).
    const name = `${id}/${WEIGHTS}`;
    // The 'L' entry's data (the name), then the header it names, at the next block.
    const longName = bytes.indexOf(Buffer.from(`${name}\0`));
    expect(longName % 512).toBe(0);
    const at = longName + 512 * Math.ceil((name.length + 1) / 512);
    const size = sourceFiles[WEIGHTS].length;
    expect(Number.parseInt(bytes.subarray(at + 124, at + 135).toString('ascii'), 8)).toBe(size);
    bytes.fill(0, at + 124, at + 136);
    bytes[at + 124] = 0x80;
    bytes.writeUIntBE(size, at + 130, 6);
    bytes.fill(0x20, at + 148, at + 156);
    let sum = 0;
    for (let i = at; i < at + 512; i++) sum += bytes[i];
    bytes.write(`${sum.toString(8).padStart(6, '0')}\0 `, at + 148, 'ascii');
    await writeFile(archive, bytes);
    const { stdout } = await execFileAsync('tar', ['tvf', archive]);
    expect(stdout).toMatch(new RegExp(` ${size} .* ${name}\\n`));

    const imported = await importModel({ modelsDir, source: archive, output, load: false });
    expect(imported.id).toBe(id);
    expect(sha256(await readFile(path.join(imported.dir, WEIGHTS)))).toBe(sha256(sourceFiles[WEIGHTS]));
  });

  it("imports a tar made on macOS, whose AppleDouble files ('._<name>') lie beside the export's folder and in it", async () => {
    const folder = path.join(work, 'mac');
    await cp(sourceDir, path.join(folder, 'sd-turbo'), { recursive: true });
    for (const appleDouble of ['._sd-turbo', '.DS_Store', 'sd-turbo/._model_index.json', 'sd-turbo/unet/._model.onnx']) await writeFile(path.join(folder, appleDouble), 'attributes');
    const archive = path.join(work, 'mac.tar');
    // In the order macOS's tar writes them: each '._' file before what it belongs to.
    await execFileAsync('tar', ['-cf', archive, '--no-recursion', '-C', folder, '._sd-turbo', '.DS_Store', ...(await readdir(folder, { recursive: true })).filter((p) => p.startsWith('sd-turbo'))]);
    const imported = await importModel({ modelsDir, source: archive, output, load: false });
    expect(imported.id).toBe('sd-turbo');
    expect(output.text).toContain('skipping 2 files an ONNX export does not need: ._model_index.json, unet/._model.onnx');
    expect(sha256(await readFile(path.join(imported.dir, WEIGHTS)))).toBe(sha256(sourceFiles[WEIGHTS]));
  });

  it('says a compressed bundle is compressed and how to unpack it, rather than that it is damaged', async () => {
    await importFrom(sourceDir, 'good');
    const { file } = await exportModel({ modelsDir, id: 'good', out: path.join(work, 'good.tar'), output });
    // As gzip (or tar czf) compresses it to carry it.
    await writeFile(`${file}.gz`, gzipSync(await readFile(file)));
    await expect(importFrom(`${file}.gz`, 'gzipped')).rejects.toThrow(`${file}.gz is gzip-compressed, not a bundle (an uncompressed tar): gunzip it and import the .tar`);
    await expectNothingInstalled('gzipped');
    // An export folder packed by 7-Zip, as on Windows, is an archive to unpack, not a model's file given for its folder.
    await writeFile(path.join(work, 'good.7z'), Buffer.concat([Buffer.from([0x37, 0x7a, 0xbc, 0xaf, 0x27, 0x1c, 0, 4]), Buffer.alloc(1024, 7)]));
    await expect(importFrom(path.join(work, 'good.7z'), 'sevenzip')).rejects.toThrow(`${path.join(work, 'good.7z')} is a 7-Zip archive, not a bundle (an uncompressed tar): unpack it (7z x) and import the model's folder`);
  });

  it('says a tar holding links was made without following them and how to make one that holds the files, rather than that it is damaged', async () => {
    // `tar cf` of a Hugging Face cache's snapshot: its files are links to blobs elsewhere, stored as links.
    const snapshot = path.join(work, 'snapshot');
    await cp(sourceDir, snapshot, { recursive: true });
    const blob = path.join(work, 'unet-weights-blob');
    await cp(path.join(snapshot, WEIGHTS), blob);
    await rm(path.join(snapshot, WEIGHTS));
    await symlink(blob, path.join(snapshot, WEIGHTS));
    const linked = path.join(work, 'linked.tar');
    await execFileAsync('tar', ['-cf', linked, '-C', work, 'snapshot']);
    const { message } = await failureOf(importFrom(linked, 'linked'));
    expect(message).toContain(`${linked} holds snapshot/${WEIGHTS} as a symbolic link (tar type '2'), not as the file it leads to; make the tar again with "tar -h"`);
    expect(message).not.toMatch(/damaged|copy it again/);
    await expectNothingInstalled('linked');
    // What the message says to do works.
    const followed = path.join(work, 'followed.tar');
    await execFileAsync('tar', ['-h', '-cf', followed, '-C', work, 'snapshot']);
    expect(sha256(await readFile(path.join((await importFrom(followed, 'followed')).dir, WEIGHTS)))).toBe(sha256(sourceFiles[WEIGHTS]));

    // A file linked twice in the folder: GNU tar stores its second name as a hard link to the first.
    await rm(path.join(snapshot, WEIGHTS));
    await cp(blob, path.join(snapshot, WEIGHTS));
    await link(path.join(snapshot, WEIGHTS), path.join(snapshot, 'unet', 'weights-backup'));
    const hard = path.join(work, 'hard.tar');
    await execFileAsync('tar', ['-cf', hard, '-C', work, 'snapshot']);
    await expect(importFrom(hard, 'hard')).rejects.toThrow(/holds snapshot\/unet\/\S+ as a hard link to another entry \(tar type '1'\), not as a file of its own; make the tar again with GNU tar's --hard-dereference/);
    await expectNothingInstalled('hard');
    const whole = path.join(work, 'whole.tar');
    await execFileAsync('tar', ['--hard-dereference', '-cf', whole, '-C', work, 'snapshot']);
    expect((await importFrom(whole, 'whole')).id).toBe('whole');
  });
});

describe('models list and remove', () => {
  it('lists models with their variant, size and status', async () => {
    await importFrom(sourceDir, 'turbo');
    await mkdir(path.join(modelsDir, 'broken', 'unet'), { recursive: true });
    const list = await listModels(modelsDir);
    expect(list).toEqual([
      { id: 'broken', status: 'broken', bytes: 0, reason: expect.stringMatching(/^missing unet\/model.onnx/) },
      { id: 'turbo', status: 'ok', family: 'sd', variant: 'sd-turbo', bytes: expect.any(Number) },
    ]);
    expect(list[1].bytes).toBeGreaterThan(sourceTotal);
  });

  it('removes a model, and refuses ids that are paths', async () => {
    await importFrom(sourceDir, 'turbo');
    await removeModel(modelsDir, 'turbo');
    expect(await registryIds()).toEqual([]);
    await expectNothingInstalled('turbo');
    for (const id of ['../turbo', 'a/b', '..', '.staging', '/etc']) {
      await expect(removeModel(modelsDir, id)).rejects.toThrow(/not a valid model id/);
    }
    await expect(removeModel(modelsDir, 'turbo')).rejects.toThrow(/there is no model 'turbo'/);
  });

  it('exports and removes a model whose folder was copied in under a name a new install refuses, as the server serves it', async () => {
    // Before, the server served 'SD 1.5 (copy)' and "models list" called it ok, but export and remove refused it as no valid id.
    const id = 'SD 1.5 (copy) ✓';
    await cp(sourceDir, path.join(modelsDir, id), { recursive: true });
    expect(await registryIds()).toEqual([id]);
    const { file } = await exportModel({ modelsDir, id, out: path.join(work, 'copy.tar'), output });
    expect((await importFrom(file, 'copy')).id).toBe('copy');
    expect(await removeModel(modelsDir, id)).toEqual({ model: true, unfinishedPull: false });
    expect(await registryIds()).toEqual(['copy']);
  });

  it('removes an unfinished pull', async () => {
    hub.dropOnce(REPO, WEIGHTS, half);
    await expect(pull(REPO, { retries: 0 })).rejects.toThrow(DownloadInterrupted);
    expect(await removeModel(modelsDir, 'sd-turbo-onnx')).toEqual({ model: false, unfinishedPull: true });
    expect(await listModels(modelsDir)).toEqual([]);
    await expectNothingInstalled('sd-turbo-onnx');
  });
});

describe('a full disk', () => {
  /** The real disk, except that writes fail with ENOSPC after `limit` bytes in all. */
  function fullAfter(limit: number): Disk {
    let written = 0;
    return {
      freeBytes: realDisk.freeBytes,
      async openWriter(file, mode) {
        const writer = await realDisk.openWriter(file, mode);
        return {
          async write(chunk) {
            written += chunk.length;
            if (written > limit) throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' });
            await writer.write(chunk);
          },
          close: () => writer.close(),
        };
      },
    };
  }

  it('fails a pull with the space needed, removing the partial download', async () => {
    await expect(pull(REPO, { disk: fullAfter(100_000) })).rejects.toThrow(
      new RegExp(`the disk holding ${modelsDir} is full: this needs ${formatBytes(sourceTotal)} and .* is free now \\(the partial copy was removed\\)`),
    );
    await expectNothingInstalled('sd-turbo-onnx');
  });

  it('stops a download that sends more than its listing says before it fills the disk, leaving nothing behind', async () => {
    // A mirror whose copy grew since its listing, by more than the disk has room for.
    hub.lengthenOnce(REPO, WEIGHTS, sourceTotal);
    const failure = await failureOf(pull(REPO, { name: 'long', disk: fullAfter(sourceTotal) }));
    expect(failure.message).toMatch(new RegExp(`^${WEIGHTS} failed verification: ${hub.url} sent more than the ${sourceFiles[WEIGHTS].length} bytes its listing gives\\. The download was discarded`));
    await expectNothingInstalled('long');
  });

  it('fails an import the same way, and checks free space before starting', async () => {
    await expect(importFrom(sourceDir, 'x').then(() => undefined)).resolves.toBeUndefined();
    await expect(importModel({ modelsDir, source: sourceDir, name: 'y', output, disk: fullAfter(10_000) })).rejects.toThrow(/is full: this needs/);
    await expectNothingInstalled('y');
    const tiny: Disk = { ...realDisk, freeBytes: async () => 1000 };
    await expect(importModel({ modelsDir, source: sourceDir, name: 'z', output, disk: tiny })).rejects.toThrow(`: ${formatBytes(sourceTotal)} is needed and 1000 B is free`);
  });
});

/** Root passes over a folder's permissions; without the capabilities that let it (setpriv, of util-linux, drops them) it is bound as any user. */
const isRoot = process.getuid?.() === 0;
const canDropCapabilities = isRoot && spawnSync('setpriv', ['--version']).status === 0;
const permissionsBind = !isRoot || canDropCapabilities;

/** `imagegen ...args` bound by the permissions of the files it uses. */
const cliWithoutPrivilege = (...args: string[]) =>
  canDropCapabilities
    ? execFileAsync('setpriv', ['--bounding-set=-dac_override,-dac_read_search', process.execPath, ...imagegenArgs(...args)], { cwd: PROJECT_ROOT })
    : cli(...args);

describe('the imagegen CLI', () => {
  it('refuses an empty path (a script\'s unset variable) as a usage error before any work', async () => {
    await importFrom(sourceDir, 'turbo');
    const empty = 'It is empty: give the path of a file or folder (in a script, is the variable set?).\n';
    const here = await mkdtemp(path.join(work, 'cwd-'));
    const inHere = (...args: string[]) => execFileAsync(process.execPath, imagegenArgs(...args), { cwd: here });
    // Export wrote the whole bundle to '.partial' in the current folder, then failed with ENOENT renaming it to ''.
    await expect(inHere('models', 'export', 'turbo', '--out', '', '--models-dir', modelsDir)).rejects.toMatchObject({ code: 2, stderr: `error: option '--out <path>' argument '' is invalid. ${empty}` });
    expect(await readdir(here)).toEqual([]);
    await expect(inHere('models', 'import', '', '--models-dir', modelsDir)).rejects.toMatchObject({ code: 2, stderr: `error: command-argument value '' is invalid for argument 'source'. ${empty}` });
    await expect(inHere('models', 'verify', '', '--golden', 'golden.json')).rejects.toMatchObject({ code: 2, stderr: `error: command-argument value '' is invalid for argument 'dir'. ${empty}` });
    await expect(inHere('models', 'verify', sourceDir, '--golden', '')).rejects.toMatchObject({ code: 2, stderr: `error: option '--golden <file>' argument '' is invalid. ${empty}` });
  });

  it("refuses a path that begins with a '~' the shell left as it is, as a usage error, rather than make a folder named '~' where no server looks", async () => {
    const home = await mkdtemp(path.join(work, 'home-'));
    const here = await mkdtemp(path.join(work, 'cwd-'));
    // The shell turns ~ into the home folder only at the start of a word: not after --flag=, in quotes, or in an environment file.
    const run = (env: Record<string, string>, ...args: string[]) => execFileAsync(process.execPath, imagegenArgs(...args), { cwd: here, env: { ...process.env, HOME: home, ...env }, timeout: 30_000 });
    const advice = expect.stringContaining(
      `'~/models' begins with '~', which only a shell turns into the home folder, and none did here (none does after a flag's '=', in quotes, or in an environment file): write ${path.join(home, 'models')}, or ./~/models for a folder named '~' here`,
    );
    // The model was installed in ./~/models, told as MODELS_DIR=<here>/~/models in a line that does not stand out.
    await expect(run({}, 'models', 'import', sourceDir, '--skip-load', '--models-dir=~/models')).rejects.toMatchObject({ code: 2, stderr: advice });
    await expect(run({ MODELS_DIR: '~/models' }, 'models', 'list')).rejects.toMatchObject({ code: 2, stderr: advice });
    await expect(run({}, 'generate', 'a red circle', '--models-dir=~/models')).rejects.toMatchObject({ code: 2, stderr: advice });
    await expect(run({}, 'serve', '--port', '0', '--data-dir=~/models')).rejects.toMatchObject({ code: 2, stderr: advice });
    // The pictures went to ./~/models.
    await expect(run({}, 'generate', 'a red circle', '--out=~/models')).rejects.toMatchObject({ code: 2, stderr: advice });
    await expect(run({}, 'models', 'import', '~/models')).rejects.toMatchObject({ code: 2, stderr: advice });
    expect(await readdir(here)).toEqual([]);
    // A folder named '~' here is still a path to give: as ./~.
    await mkdir(path.join(here, '~'));
    expect((await run({}, 'models', 'list', '--models-dir=./~')).stdout).toContain('no models in ./~');
  });

  it('quotes a path with a space or a quote in the commands it suggests, so that one pasted into a shell runs', async () => {
    await importFrom(sourceDir, 'turbo');
    const folder = path.join(work, "Bob's models");
    await mkdir(folder);
    const bundle = path.join(folder, 'turbo.tar');
    // It said "install it with: imagegen models import /tmp/.../Bob's models/turbo.tar": a shell waits for the quote to close.
    const { stdout } = await cli('models', 'export', 'turbo', '--out', folder, '--models-dir', modelsDir);
    const suggested = /install it with: (imagegen .*)\n$/.exec(stdout)?.[1] ?? '';
    expect(suggested).toMatch(/^imagegen models import ["']/);
    // The shell reads back the very path.
    const { stdout: words } = await execFileAsync('sh', ['-c', `printf '%s\\n' ${suggested}`]);
    expect(words).toBe(`imagegen\nmodels\nimport\n${bundle}\n`);
    // The folder a server is to read, and an export's folder to pick among several.
    const spaced = path.join(work, 'my models');
    const installed = await cli('models', 'import', sourceDir, '--name', 'spaced', '--skip-load', '--models-dir', spaced);
    expect(installed.stdout).toContain(`a server with MODELS_DIR='${spaced}' picks it up`);
    const parent = path.join(work, 'two-exports');
    for (const name of ['sd 15', 'sdxl']) await cp(sourceDir, path.join(parent, name), { recursive: true });
    await expect(importFrom(parent)).rejects.toThrow(`pick the export's folder: imagegen models import '${parent}/sd 15' or imagegen models import ${parent}/sdxl`);
  });

  it("says what is wrong with a golden file 'models verify' cannot use and where docs/verify.md describes one, rather than Node's error", async () => {
    const docs = '(docs/verify.md, "The golden file",';
    const verify = (golden: string) => cli('models', 'verify', sourceDir, '--golden', golden);
    const missing = path.join(work, 'missing.json');
    // Node's own words were all it said: "cannot read it as JSON: ENOENT: no such file or directory, open '...'".
    await expect(verify(missing)).rejects.toMatchObject({
      code: 2,
      stderr: `imagegen models verify: ${missing}: does not exist: give --golden the path of the model's golden file ${docs} says what one holds and how to make it with diffusers)\n`,
    });
    await expect(verify(work)).rejects.toMatchObject({ code: 2, stderr: expect.stringContaining(`${work}: is a folder: give --golden the path of the model's golden file ${docs}`) });
    await writeFile(path.join(work, 'cut.json'), '{"cases": [');
    await expect(verify(path.join(work, 'cut.json'))).rejects.toMatchObject({ code: 2, stderr: expect.stringMatching(/cut\.json: is not JSON \(.+\): a golden file is the JSON that docs\/verify\.md, "The golden file", describes\n$/) });
    await writeFile(path.join(work, 'other.json'), '{"images": []}');
    await expect(verify(path.join(work, 'other.json'))).rejects.toMatchObject({ code: 2, stderr: expect.stringMatching(/other\.json: not a golden file: cases: .* \(docs\/verify\.md, "The golden file", lists the fields it takes\)\n$/) });
  });

  it.skipIf(!permissionsBind)(
    `says what to do about a folder it may not read or write, rather than Node's error or "no models"${permissionsBind ? '' : ' (skipped: root, and no setpriv to drop the capabilities that pass over permissions)'}`,
    async () => {
      await importFrom(sourceDir, 'turbo');
      const locked = path.join(work, 'locked');
      await mkdir(locked);
      await chmod(locked, 0o555);
      const advice = "(EACCES): run imagegen as a user who may (the folder's owner), give this user access to it (chown, chmod), or choose another folder\n";
      // A models folder it cannot write, an --out it cannot write, a source it cannot read.
      await expect(cliWithoutPrivilege('models', 'import', sourceDir, '--skip-load', '--models-dir', locked)).rejects.toMatchObject({
        code: 1,
        stderr: `error: no permission to create ${path.join(locked, '.staging')} ${advice}`,
      });
      await expect(cliWithoutPrivilege('models', 'export', 'turbo', '--out', locked, '--models-dir', modelsDir)).rejects.toMatchObject({
        code: 1,
        stderr: `error: no permission to open ${path.join(locked, 'turbo.tar.partial')} ${advice}`,
      });
      const unreadable = await copyOfSource();
      await chmod(path.join(unreadable, 'unet'), 0o000);
      await expect(cliWithoutPrivilege('models', 'import', unreadable, '--skip-load', '--models-dir', modelsDir)).rejects.toMatchObject({
        code: 1,
        stderr: `error: no permission to list ${path.join(unreadable, 'unet')} ${advice}`,
      });
      await chmod(path.join(unreadable, 'unet'), 0o755);
      // A file it may not read is no damaged one, to be copied again: in an import, and in the list of installed models.
      const unreadableFile = /no permission to read unet\/model\.onnx \(EACCES\): let the user running imagegen read every file of the model \(chmod -R a\+rX on its folder, or chown\)/;
      await chmod(path.join(unreadable, 'unet', 'model.onnx'), 0o000);
      await expect(cliWithoutPrivilege('models', 'import', unreadable, '--skip-load', '--models-dir', modelsDir)).rejects.toMatchObject({
        code: 1,
        stderr: expect.stringMatching(new RegExp(`^error: ${unreadable} is not a usable model folder: ${unreadableFile.source}\\. Nothing was installed\n$`)),
      });
      await chmod(path.join(modelsDir, 'turbo', 'unet', 'model.onnx'), 0o000);
      expect((await cliWithoutPrivilege('models', 'list', '--models-dir', modelsDir)).stdout).toMatch(new RegExp(`\\nturbo\\s.*broken: ${unreadableFile.source}`));
      // A models folder it cannot read holds models all the same: not "no models".
      await chmod(modelsDir, 0o000);
      try {
        await expect(cliWithoutPrivilege('models', 'list', '--models-dir', modelsDir)).rejects.toMatchObject({ code: 1, stderr: `error: no permission to list ${modelsDir} ${advice}` });
      } finally {
        await chmod(modelsDir, 0o755);
      }
    },
  );

  it('lists models with "imagegen models list"', async () => {
    await importFrom(sourceDir, 'turbo');
    const dataDir = path.join(modelsDir, '..', 'data');
    const listing = () => execFileAsync(process.execPath, imagegenArgs('models', 'list', '--models-dir', modelsDir, '--data-dir', dataDir), { cwd: PROJECT_ROOT });
    const list = async () => (await listing()).stdout;
    const unmeasured = await listing();
    expect(unmeasured.stdout).toMatch(/^ID\s+MODEL\s+SIZE\s+MEMORY\s+STATUS\nturbo\s+sd\/sd-turbo\s+\d+\.\d [KM]iB\s+not measured\s+ok\n$/);
    // A data folder that is not there (mistyped) is said to be, not taken for a server that measured nothing.
    expect(unmeasured.stderr).toContain(`note: ${path.resolve(dataDir)} (--data-dir or DATA_DIR) does not exist, so no measured memory was read`);
    // What a server's workers measured for the model, as the server keeps it in its data folder.
    const figures = await MemoryFigures.open(dataDir);
    figures.record(path.resolve(modelsDir, 'turbo'), { weightsBytes: 1.5 * 2 ** 30, peakBytes: 2 ** 30, peakPixels: 2 ** 20 });
    await figures.flushed();
    expect(await list()).toMatch(/\nturbo\s+sd\/sd-turbo\s+\d+\.\d [KM]iB\s+1\.5 GiB \+ 1\.0 GiB at 1\.0 MP\s+ok\n$/);
    expect((await listing()).stderr).not.toContain('note:');
    // An id that is also an OpenAI model name, or the embedded model's, changes what requests for it run: said so.
    for (const [name, note] of [['dall-e-3', /note: dall-e-3 is also an OpenAI model name: requests naming it now run this model/], ['demo-shapes', /note: demo-shapes is also the id of a model that comes with the server/]] as const) {
      const { stdout } = await cli('models', 'import', sourceDir, '--name', name, '--skip-load', '--models-dir', modelsDir);
      expect(stdout).toMatch(note);
    }
    const mine = (await cli('models', 'import', sourceDir, '--name', 'mine', '--skip-load', '--models-dir', modelsDir)).stdout;
    expect(mine).not.toMatch(/note:/);
    // Which server sees it, and how to ask for it.
    expect(mine).toContain(`a server with MODELS_DIR=${modelsDir} picks it up (or the new version of a model it replaced) with its next request, or at its next rescan (MODELS_RESCAN_SECONDS): "model": "mine", or DEFAULT_MODEL=mine`);
    // A models folder given relative to where the command ran is named as a server started elsewhere finds it.
    const relative = await execFileAsync(process.execPath, imagegenArgs('models', 'import', sourceDir, '--name', 'relative', '--skip-load', '--models-dir', 'models'), { cwd: work });
    expect(relative.stdout).toContain(`a server with MODELS_DIR=${modelsDir} picks it up`);
    // A mistyped folder is no empty one.
    const missing = path.join(modelsDir, 'no-such-folder');
    await expect(cli('models', 'list', '--models-dir', missing)).rejects.toMatchObject({
      code: 1,
      stderr: expect.stringMatching(new RegExp(`error: ${missing} is not there \\(ENOENT\\): pass the folder the server reads models from .*models import\` and \`models pull\` create it`)),
    });
    // Arguments refused before any work are usage errors (exit 2, as README says), as an unknown flag is.
    await expect(cli('models', 'pull', 'not a repo', '--models-dir', modelsDir)).rejects.toMatchObject({ code: 2, stderr: expect.stringContaining("error: 'not a repo' is not a Hub repository") });
    await expect(cli('models', 'import', sourceDir, '--name', 'a/b', '--models-dir', modelsDir)).rejects.toMatchObject({ code: 2, stderr: expect.stringContaining("error: 'a/b' is not a valid model id") });
    for (const hubUrl of ['huggingface.co', 'ftp://mirror.example.com']) {
      await expect(cli('models', 'pull', REPO, '--hub-url', hubUrl, '--models-dir', modelsDir)).rejects.toMatchObject({
        code: 2,
        stderr: `error: '${hubUrl}' is not an http(s) address of a Hub: set HF_ENDPOINT (--hub-url) to one such as https://huggingface.co, or unset it\n`,
      });
    }
    // A mirror's password in the address: fetch never sends it, and every message naming the Hub showed it.
    await expect(cli('models', 'pull', REPO, '--hub-url', 'https://ci:hunter2@mirror.example.com', '--models-dir', modelsDir)).rejects.toMatchObject({
      code: 2,
      stderr: "error: 'https://[redacted]@mirror.example.com' holds a user:password, which is never sent: set HF_ENDPOINT (--hub-url) without it, and give the Hub's or mirror's token in HF_TOKEN (sent as Authorization: Bearer)\n",
    });
    await expect(execFileAsync(process.execPath, imagegenArgs('models', 'list'), { cwd: PROJECT_ROOT, env: { ...process.env, MODELS_DIR: '' } })).rejects.toMatchObject({
      code: 2,
      stderr: expect.stringContaining('error: no models folder given'),
    });
    // A file where the models folder would be: a message, not a stack trace.
    const file = path.join(work, 'a-file');
    await writeFile(file, 'not a folder');
    for (const command of [['import', sourceDir, '--skip-load'], ['pull', REPO, '--hub-url', hub.url]]) {
      await expect(cli('models', ...command, '--models-dir', file)).rejects.toMatchObject({
        code: 1,
        stderr: expect.stringMatching(
          new RegExp(`^error: cannot create ${file}(/\\.staging)?: a file is in the way, where a folder is needed \\(it, or a folder on its path, is a file; E(EXIST|NOTDIR)\\): name a folder, not a file\n$`),
        ),
      });
    }
    // The settings it shares with the server read as the server reads them: set empty is unset, spaces around a value dropped.
    const here = await mkdtemp(path.join(work, 'cwd-'));
    const defaultFigures = await MemoryFigures.open(path.join(here, 'data'));
    defaultFigures.record(path.resolve(modelsDir, 'turbo'), { weightsBytes: 2 ** 30, peakBytes: 2 ** 30, peakPixels: 2 ** 20 });
    await defaultFigures.flushed();
    const asServe = await execFileAsync(process.execPath, imagegenArgs('models', 'list'), {
      cwd: here,
      env: { ...process.env, MODELS_DIR: ` ${modelsDir} `, DATA_DIR: '', EXECUTION_PROVIDER: '', GRAPH_REWRITES: ' ' },
    });
    expect(asServe.stdout).toMatch(/\nturbo\s+sd\/sd-turbo\s+\d+\.\d [KM]iB\s+1\.0 GiB \+ 1\.0 GiB at 1\.0 MP\s+ok\n/);
    await expect(execFileAsync(process.execPath, imagegenArgs('models', 'list', '--models-dir', modelsDir), { cwd: here, env: { ...process.env, EXECUTION_PROVIDER: 'tpu' } })).rejects.toMatchObject({
      code: 2,
      stderr: "error: option '--execution-provider <provider>' value 'tpu' from env 'EXECUTION_PROVIDER' is invalid. Allowed choices are cpu, cuda, webgpu.\n",
    });
    // A model's own folder is not a folder of models: said, rather than a broken "model" for each of its components.
    await expect(cli('models', 'list', '--models-dir', sourceDir)).rejects.toMatchObject({
      code: 1,
      stderr: expect.stringContaining(`error: the models folder ${sourceDir} is a model folder itself (it has model_index.json; its sub-folders are that model's parts)`),
    });
  });
});
