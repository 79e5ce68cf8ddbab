import { mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { inject } from 'vitest';
import { ModelRegistry } from '../src/models/registry.js';
import { writeStubModel } from './helpers/api-server.js';
import { capturedLogs, silentLogger } from './helpers/logs.js';

/** Model discovery: folders become models with presets; aliases; changes seen without restart. */

let root: string;
beforeEach(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-registry-'));
});
afterEach(() => rm(root, { recursive: true, force: true }));

function registry(dirs: string[], aliases: Record<string, string> = {}) {
  return new ModelRegistry({ roots: dirs.map((dir, i) => ({ dir, ownedBy: `root${i}` })), aliases, logger: silentLogger, minRescanIntervalMs: 0 });
}

describe('ModelRegistry', () => {
  it('recognises every reference family and gives it its variant preset', async () => {
    const models = registry([inject('referenceModelsDir')]);
    await models.scan();
    const found = Object.fromEntries(
      models.list().map(({ id, model }) => [id, { variant: model.layout.variant, size: model.preset.defaultSize, steps: model.preset.steps }]),
    );
    expect(found).toMatchObject({
      'sd15-legacy': { variant: 'sd15', steps: { standard: 25, hd: 50 } },
      'sd2-v': { variant: 'sd2' },
      'sd-turbo': { variant: 'sd-turbo', steps: { standard: 1, hd: 4 } },
      sdxl: { variant: 'sdxl' },
      lcm: { variant: 'lcm', steps: { standard: 4, hd: 8 } },
      'flux-schnell': { variant: 'flux-schnell', size: '1024x1024', steps: { standard: 4, hd: 8 } },
      'flux-dev': { variant: 'flux-dev', steps: { standard: 28, hd: 50 } },
    });
    const flux = await models.resolve('flux-dev');
    expect(flux!.schedulers).not.toContain('euler');
    expect(flux!.preset.sizes).toContain('1792x1024');
  });

  it('applies imagegen.json and skips folders that are not usable models', async () => {
    await writeStubModel(path.join(root, 'good'), {
      sizes: ['256x256', '512x512'],
      steps: { hd: 8 },
      guidance_scale: { natural: 1 },
      guidance_rescale: 0.7,
      negative_prompt: 'blurry',
    });
    await writeStubModel(path.join(root, 'bad-override'), { sizes: ['huge'] });
    await writeStubModel(path.join(root, 'bad-default'), { sizes: ['256x256'], default_size: '512x512' });
    await writeStubModel(path.join(root, 'bad-scheduler'), { scheduler: 'flow-match-euler' });
    await writeStubModel(path.join(root, 'bad-size'), { sizes: ['500x500'] });
    await writeStubModel(path.join(root, 'bad-steps'), { steps: { low: 3, standard: 2, hd: 1 } });
    // A standard above the variant's hd lifts hd with it rather than contradict it.
    await writeStubModel(path.join(root, 'slow'), { steps: { standard: 60 } });
    await mkdir(path.join(root, 'not-a-model'));
    await writeFile(path.join(root, 'stray-file.onnx'), '');
    const models = registry([root]);
    await models.scan();
    expect(models.list().map((m) => m.id)).toEqual(['good', 'slow']);
    expect((await models.resolve('slow'))!.preset.steps).toMatchObject({ standard: 60, hd: 60 });
    // A stray file is no model folder at all; the skipped folders are listed with their reason for /ready.
    expect(models.unusable().map(({ id, reason }) => [id, reason])).toEqual([
      ['bad-default', expect.stringMatching(/^imagegen\.json: default_size 512x512 is not one of its sizes/)],
      ['bad-override', expect.stringMatching(/^imagegen\.json: sizes/)],
      ['bad-scheduler', expect.stringMatching(/^imagegen\.json: scheduler 'flow-match-euler' does not fit this model/)],
      ['bad-size', expect.stringMatching(/^imagegen\.json: sizes 500x500 do not fit this model/)],
      ['bad-steps', 'imagegen.json: steps must not fall from low to standard to hd; they are 3, 2 and 1'],
      ['not-a-model', expect.stringMatching(/^missing unet\/model\.onnx/)],
    ]);
    const good = (await models.resolve('good'))!;
    expect(good.preset).toMatchObject({
      sizes: ['256x256', '512x512'],
      defaultSize: '512x512',
      steps: { standard: 1, hd: 8 },
      guidanceScale: { vivid: 0, natural: 1 },
      guidanceRescale: 0.7,
      negativePrompt: 'blurry',
    });
  });

  it('lets an earlier root hide a model of the same id', async () => {
    const [user, embedded] = [path.join(root, 'user'), path.join(root, 'embedded')];
    await writeStubModel(path.join(user, 'demo'), { sizes: ['256x256'] });
    await writeStubModel(path.join(embedded, 'demo'));
    await writeStubModel(path.join(embedded, 'other'));
    const models = registry([user, embedded, path.join(root, 'missing')]);
    await models.scan();
    expect(models.list().map((m) => [m.id, m.model.ownedBy, m.model.preset.defaultSize])).toEqual([
      ['demo', 'root0', '256x256'],
      ['other', 'root1', '512x512'],
    ]);
  });

  it('resolves aliases, listing only those whose model is installed', async () => {
    await writeStubModel(path.join(root, 'demo'));
    const models = registry([root], { 'dall-e-3': 'demo', 'gpt-image-1': 'absent' });
    await models.scan();
    expect(models.list().map((m) => m.id)).toEqual(['demo', 'dall-e-3']);
    expect((await models.resolve('dall-e-3'))?.id).toBe('demo');
    expect(await models.resolve('gpt-image-1')).toBeUndefined();
  });

  it('finds a model added after start on first request, and forgets a removed one', async () => {
    const models = registry([root]);
    await models.scan();
    expect(await models.resolve('late')).toBeUndefined();
    await writeStubModel(path.join(root, 'late'));
    expect((await models.resolve('late'))?.id).toBe('late');
    await rm(path.join(root, 'late'), { recursive: true });
    await models.refresh();
    expect(models.list()).toEqual([]);
  });

  it('finds a model installed right after a scan (models pull, import): its root changed, which the rate limit does not hold back', async () => {
    const models = new ModelRegistry({ roots: [{ dir: root, ownedBy: 'user' }], aliases: {}, logger: silentLogger, minRescanIntervalMs: 60_000 });
    await models.scan();
    expect(await models.resolve('nope')).toBeUndefined();
    // Installed as the installer does: made aside, renamed into the models folder.
    await writeStubModel(path.join(root, '.staging-late'));
    await rename(path.join(root, '.staging-late'), path.join(root, 'late'));
    expect((await models.resolve('late'))?.id).toBe('late');
  });

  it('gives a model replaced right after a scan (models import --force) as its new version at once, not the old one until a rescan', async () => {
    const models = new ModelRegistry({ roots: [{ dir: root, ownedBy: 'user' }], aliases: {}, logger: silentLogger, minRescanIntervalMs: 60_000 });
    await writeStubModel(path.join(root, 'swap'), { sizes: ['256x256'] });
    await models.scan();
    const old = (await models.resolve('swap'))!;
    // Replaced as the installer does: the new one made aside, the old renamed away, the new renamed in.
    await writeStubModel(path.join(root, '.staging-swap'), { sizes: ['512x512'] });
    await rename(path.join(root, 'swap'), path.join(root, '.trash-swap'));
    await rename(path.join(root, '.staging-swap'), path.join(root, 'swap'));
    // Before, the old entry answered until a rescan: with MODELS_RESCAN_SECONDS=0, until a restart.
    const replaced = (await models.resolve('swap'))!;
    expect(replaced.preset.sizes).toEqual(['512x512']);
    expect(replaced.version).not.toBe(old.version);
  });

  it('gives a model replaced right after a scan as its new version to every request that comes together, not only to the one that rescans', async () => {
    const models = new ModelRegistry({ roots: [{ dir: root, ownedBy: 'user' }], aliases: {}, logger: silentLogger, minRescanIntervalMs: 60_000 });
    await writeStubModel(path.join(root, 'swap'), { sizes: ['256x256'] });
    await models.scan();
    await writeStubModel(path.join(root, '.staging-swap'), { sizes: ['512x512'] });
    await rename(path.join(root, 'swap'), path.join(root, '.trash-swap'));
    await rename(path.join(root, '.staging-swap'), path.join(root, 'swap'));
    // Before, the first request's rescan took the folder's new time as it began: those beside it found the
    // folder unchanged and answered the old entry, which a worker holding the old model then ran.
    const resolved = await Promise.all(Array.from({ length: 4 }, () => models.resolve('swap')));
    expect(resolved.map((model) => model!.preset.sizes)).toEqual(Array(4).fill(['512x512']));
  });

  it('scans for a model a request names, rate-limited on a clock that a step of the wall clock back does not stop', async () => {
    const models = new ModelRegistry({ roots: [{ dir: root, ownedBy: 'user' }], aliases: {}, logger: silentLogger, minRescanIntervalMs: 2000 });
    vi.useFakeTimers({ toFake: ['Date', 'performance'] });
    try {
      await models.scan();
      // NTP steps the clock back an hour; then a model is installed, and a request names it.
      vi.setSystemTime(Date.now() - 3600_000);
      vi.advanceTimersByTime(3000);
      await writeStubModel(path.join(root, 'late'));
      // On the wall clock the last scan lay an hour ahead: none on request for that hour (with MODELS_RESCAN_SECONDS=0, none at all).
      expect((await models.resolve('late'))?.id).toBe('late');
    } finally {
      vi.useRealTimers();
    }
  });

  it('says in its log that a model it serves was read again, and whether its workers load it anew', async () => {
    await writeStubModel(path.join(root, 'tuned'), { sizes: ['512x512'] });
    const logs = capturedLogs<{ msg: string; model?: string }>();
    const models = new ModelRegistry({ roots: [{ dir: root, ownedBy: 'user' }], aliases: {}, logger: logs.logger, minRescanIntervalMs: 0 });
    await models.scan();
    await models.scan();
    expect(logs.lines.filter((line) => line.model === 'tuned')).toEqual([]);
    await writeFile(path.join(root, 'tuned', 'imagegen.json'), JSON.stringify({ sizes: ['256x256', '512x512'] }));
    await models.scan();
    expect((await models.resolve('tuned'))?.preset.sizes).toEqual(['256x256', '512x512']);
    await writeFile(path.join(root, 'tuned', 'README.md'), 'A file of the export that is not imagegen.json.');
    await models.scan();
    expect(logs.lines.filter((line) => line.model === 'tuned').map((line) => line.msg)).toEqual([
      "model 'tuned' read again: its imagegen.json changed, and the next requests for it follow it",
      "model 'tuned' read again: its files changed, and the workers load it anew as they next run it",
    ]);
  });

  it('notices a broken folder once it is repaired', async () => {
    await writeStubModel(path.join(root, 'fixme'), { sizes: ['huge'] });
    const models = registry([root]);
    await models.scan();
    expect(models.list()).toEqual([]);
    await writeFile(path.join(root, 'fixme', 'imagegen.json'), JSON.stringify({ sizes: ['512x512'] }));
    await models.refresh();
    expect(models.list().map((m) => m.id)).toEqual(['fixme']);
    expect(models.unusable()).toEqual([]);
  });
});
