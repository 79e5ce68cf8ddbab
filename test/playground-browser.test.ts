import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { chromium, type Browser, type Page } from 'playwright-core';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromiumPath, NO_CHROMIUM, openPlayground, runOnPage } from './helpers/browser.js';
import { holdBusyWorker } from './helpers/busy-worker.js';
import { auth, MODEL, OPS_KEY, startOpsServer, untilReady, type OpsServer } from './helpers/ops-server.js';
import { CURRENT_OPENAI_PYTHON, openaiPython } from './helpers/openai-python.js';
import { readImageFile } from './helpers/picture.js';
import type { ImagesResponse, ModelObject } from '../src/api/wire.js';

/**
 * The playground in headless Chromium against the whole server (worker processes, the reference
 * SD-Turbo `shapes`, API keys): key, generation with streamed previews, Cancel, errors beside their
 * field, a painted mask and an edit, and "copy as code" run for real. PLAYGROUND_SCREENSHOT=<file>
 * also saves a screenshot of the page (docs/playground.png is made so).
 */

const run = promisify(execFile);

/** The real openai-python, in a virtual environment of the tests' own (helpers/openai-python.ts); where it cannot be had, the Python test skips saying why. */
const openai = await openaiPython(CURRENT_OPENAI_PYTHON);

/** The bytes behind an <img> of the page (a blob: or the server's URL), fetched inside the page. */
async function imageBytes(page: Page, selector: string): Promise<Buffer> {
  const bytes = await page.$eval(selector, async (img) => Array.from(new Uint8Array(await (await fetch((img as HTMLImageElement).src)).arrayBuffer())));
  return Buffer.from(bytes);
}

/** The mean RGB of a band of columns (sharp's stats() would read the whole picture). */
async function meanColour(image: Buffer, left: number, width: number): Promise<number[]> {
  const { data, info } = await sharp(image).removeAlpha().extract({ left, top: 0, width, height: 256 }).raw().toBuffer({ resolveWithObject: true });
  const sums = [0, 0, 0];
  for (let i = 0; i < data.length; i++) sums[i % 3] += data[i];
  return sums.map((sum) => sum / (info.width * info.height));
}

async function pixels(image: Buffer | string): Promise<Buffer> {
  return sharp(image).removeAlpha().raw().toBuffer();
}

/** One Chromium for both describes (a context each keeps their pages apart): a launch is seconds of the cores. */
let browser: Browser;
beforeAll(async () => {
  if (chromiumPath) browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox'] });
});
afterAll(() => browser?.close());

describe.skipIf(!chromiumPath)(`the playground in headless Chromium${chromiumPath ? '' : NO_CHROMIUM}`, () => {
  let server: OpsServer;
  let origin: string;
  let page: Page;
  let work: string;

  beforeAll(async () => {
    // On IPv6 loopback, so that the page's origin, which the copied curl snippet names, has brackets: a glob to zsh (the macOS shell).
    server = await startOpsServer({ env: { HOST: '::1' } });
    origin = server.server.url;
    await untilReady(origin, 60_000);
    const context = await browser.newContext({ permissions: ['clipboard-read', 'clipboard-write'], viewport: { width: 1280, height: 900 } });
    page = await context.newPage();
    work = await mkdtemp(path.join(os.tmpdir(), 'imagegen-playground-'));
  });

  afterAll(async () => {
    await page?.context().close();
    await server?.close();
    if (work) await rm(work, { recursive: true, force: true });
  });

  /** Fills the settings for a quick, fixed-seed picture of the reference model. */
  async function settings(fields: { prompt?: string; size?: string; steps?: string; n?: string; seed?: string }): Promise<void> {
    if (fields.prompt !== undefined) await page.fill('#prompt', fields.prompt);
    if (fields.size) await page.selectOption('#size', fields.size);
    if (fields.steps) await page.fill('#steps', fields.steps);
    if (fields.n) await page.fill('#n', fields.n);
    if (fields.seed) await page.fill('#seed', fields.seed);
  }

  const runAndWait = (selector: string) => runOnPage(page, selector);

  /** Copies a snippet from the open code dialog, and reads it back from the clipboard once the page says it is there. */
  async function copied(language: 'curl' | 'python' | 'node'): Promise<string> {
    await page.click(`button[data-copy="${language}"]`);
    // The page writes the clipboard asynchronously: read at once, it may still hold what it held before.
    await expect.poll(() => page.textContent(`button[data-copy="${language}"] + [role=status]`), { timeout: 30_000 }).toBe('Copied.');
    return page.evaluate(() => navigator.clipboard.readText());
  }

  it('asks for the API key, says clearly when it is wrong, and lists the models with the right one', async () => {
    const page404 = await page.goto(`${origin}/`);
    expect(page404?.status()).toBe(200);
    await expect.poll(() => page.isVisible('#key-dialog'), { timeout: 30_000 }).toBe(true);
    // The key with its dashes made typographic, as a word processor copies it: a browser cannot send
    // it (a header is Latin-1), and the page did nothing, but for an uncaught error.
    const uncaught: string[] = [];
    page.on('pageerror', (err) => uncaught.push(err.message));
    await page.fill('#key', OPS_KEY.replaceAll('-', '\u2013'));
    await page.click('#key-save');
    await expect.poll(() => page.textContent('#key-error'), { timeout: 30_000 }).toContain("This key cannot be sent: it has '\u2013' (U+2013)");
    expect(await page.getAttribute('#key', 'aria-invalid')).toBe('true');
    expect(await page.inputValue('#key')).toBe(OPS_KEY.replaceAll('-', '\u2013'));
    expect(await page.evaluate(() => sessionStorage.getItem('imagegen.apiKey'))).toBeNull();
    expect(uncaught).toEqual([]);
    await page.fill('#key', 'sk-wrong-0123456789');
    await page.click('#key-save');
    await expect.poll(() => page.textContent('#key-error'), { timeout: 30_000 }).toContain('Incorrect API key provided');
    expect(await page.getAttribute('#key', 'aria-invalid')).toBe('true');
    await page.fill('#key', OPS_KEY);
    await page.click('#key-save');
    await expect.poll(() => page.isVisible('#key-dialog'), { timeout: 30_000 }).toBe(false);
    const offered = await page.$$eval('#model option', (options) => options.map((o) => o.textContent));
    // The server's default (DEFAULT_MODEL) is chosen, though the embedded demo model is listed before it.
    expect(offered.indexOf('demo-shapes')).toBeLessThan(offered.indexOf(MODEL));
    expect(await page.inputValue('#model')).toBe(MODEL);
    expect(await page.$$eval('#size option', (options) => options.map((o) => o.textContent))).toEqual(['128x128', '256x256', '512x512', '1024x1024']);
    // Kept for this tab only.
    expect(await page.evaluate(() => sessionStorage.getItem('imagegen.apiKey'))).toBe(OPS_KEY);
    expect(await page.evaluate(() => localStorage.length)).toBe(0);
  });

  it('generates on Ctrl+Enter, shows the picture forming, and draws what the prompt asked for', async () => {
    await settings({ prompt: 'a red circle', size: '256x256', steps: '12', seed: '7' });
    await page.selectOption('#partial_images', '3');
    // Every preview the page shows, counted as it appears (they are removed once the image is done).
    await page.evaluate(() => {
      const seen = { previews: 0, sources: [] as string[] };
      Object.assign(window, { seen });
      new MutationObserver((changes) =>
        changes.forEach((c) => {
          const images = [...c.addedNodes].filter((n): n is HTMLImageElement => n.nodeName === 'IMG');
          seen.previews += images.length;
          seen.sources.push(...images.map((image) => image.src));
        }),
      ).observe(document.getElementById('previews')!, { childList: true });
    });
    await page.focus('#prompt');
    await page.keyboard.press('Control+Enter');
    await page.waitForSelector('#results .result-image');
    await expect.poll(() => page.textContent('#status'), { timeout: 30_000 }).toMatch(/^Done: 1 image/);
    expect(await page.evaluate(() => (window as unknown as { seen: { previews: number } }).seen.previews)).toBeGreaterThan(0);
    // Their pictures are let go once they are removed: each preview's blob URL no longer loads.
    const previewsStillLoading = await page.evaluate(async () => {
      const { sources } = (window as unknown as { seen: { sources: string[] } }).seen;
      const loads = await Promise.all(sources.map((src) => fetch(src).then(() => true, () => false)));
      return { count: sources.length, loading: loads.filter(Boolean).length };
    });
    expect(previewsStillLoading.count).toBeGreaterThan(0);
    expect(previewsStillLoading.loading).toBe(0);

    const { reading, info } = await readImageFile(await imageBytes(page, '#results .result-image'));
    expect(info.width).toBe(256);
    expect(reading).toMatchObject({ colour: 'red', shape: 'circle' });
    expect(await page.textContent('#results figcaption')).toMatch(/^seed 7 · 256x256 · shapes · \d+\.\d s$/);
    expect(await page.getAttribute('#results .result-image', 'alt')).toBe('a red circle (seed 7)');
    expect(await page.textContent('#history li')).toContain('streamed: kept in this tab only');
  });

  it('copies the curl and Node snippets, whose requests give the same image for the same seed', async () => {
    const shown = await pixels(await imageBytes(page, '#results .result-image'));
    await page.click('#results button:has-text("Copy as code")');
    const curl = await copied('curl');
    expect(curl).toContain('"seed":7');
    // zsh (the macOS shell) takes no comment after a line continuation: none is there, and each command has lines of its own.
    expect(curl).not.toMatch(/\\\n\s*#/);
    // zsh also fails a word whose glob matches no file ("no matches found"), as [::1] in an unquoted URL
    // does: bash's failglob does the same, and -e makes that command's failure the run's, which then
    // fails on an unquoted URL of the page's origin ("no match: http://[::1]:...") rather than go on to jq.
    expect(origin).toMatch(/^http:\/\/\[::1\]:\d+$/);
    await run('bash', ['-e', '-O', 'failglob', '-c', curl], { cwd: work, env: { ...process.env, OPENAI_API_KEY: OPS_KEY } });
    const answer = JSON.parse(await readFile(path.join(work, 'response.json'), 'utf8')) as ImagesResponse;
    expect(await pixels(Buffer.from(answer.data[0].b64_json!, 'base64'))).toEqual(shown);
    // Its second command writes the picture, as the dialog says.
    expect(await pixels(path.join(work, 'image-7.png'))).toEqual(shown);

    const node = await copied('node');
    // The real openai-node client, from the project's node_modules.
    await mkdir(path.join(work, 'node'), { recursive: true });
    await symlink(path.resolve('node_modules'), path.join(work, 'node', 'node_modules'));
    await writeFile(path.join(work, 'node', 'snippet.mjs'), node);
    await run('node', ['snippet.mjs'], { cwd: path.join(work, 'node'), env: { ...process.env, OPENAI_API_KEY: OPS_KEY } });
    expect(await pixels(path.join(work, 'node', 'image-7.png'))).toEqual(shown);
    await page.keyboard.press('Escape');
  });

  it.skipIf('missing' in openai)(
    `copies the Python snippet and runs it with openai-python ${CURRENT_OPENAI_PYTHON}: the same image for the same seed${'missing' in openai ? ` (skipped: ${openai.missing})` : ''}`,
    async () => {
      if ('missing' in openai) throw new Error(openai.missing);
      const shown = await pixels(await imageBytes(page, '#results .result-image'));
      await page.click('#results button:has-text("Copy as code")');
      const python = await copied('python');
      await page.keyboard.press('Escape');
      expect(python).toContain('extra_body={"steps": 12, "seed": 7}');
      const dir = path.join(work, 'python');
      await mkdir(dir, { recursive: true });
      await writeFile(path.join(dir, 'snippet.py'), python);
      await run(openai.python, ['snippet.py'], { cwd: dir, env: { ...process.env, OPENAI_API_KEY: OPS_KEY } });
      expect(await pixels(path.join(dir, 'image-7.png'))).toEqual(shown);
    },
  );

  it('reuses the settings of a result, seed included', async () => {
    await settings({ prompt: 'something else', steps: '3' });
    await page.check('input[name=seed_mode][value=random]');
    await page.click('#results button:has-text("Reuse settings")');
    expect(await page.inputValue('#prompt')).toBe('a red circle');
    expect(await page.inputValue('#steps')).toBe('12');
    expect(await page.inputValue('#seed')).toBe('7');
    expect(await page.isChecked('input[name=seed_mode][value=fixed]')).toBe(true);
  });

  it('shows an API error as words beside the field it names, and focuses that field', async () => {
    await settings({ steps: '151' });
    await page.click('#generate');
    await expect.poll(() => page.textContent('#steps-error'), { timeout: 30_000 }).toContain("Invalid 'steps'");
    expect(await page.getAttribute('#steps', 'aria-invalid')).toBe('true');
    expect(await page.evaluate(() => document.activeElement?.id)).toBe('steps');
    expect(await page.textContent('#steps-error')).not.toContain('{');
    await settings({ steps: '12' });
  });

  it('paints a mask over a result and runs an edit that redraws only the painted half', async () => {
    await settings({ prompt: 'a red square', seed: '3' });
    await runAndWait('#generate');
    const source = await imageBytes(page, '#results .result-image');
    await page.click('#results button:has-text("Edit")');
    await page.waitForSelector('#mask', { state: 'visible' });
    expect(await page.$eval('#mask', (c) => [(c as HTMLCanvasElement).width, (c as HTMLCanvasElement).height])).toEqual([256, 256]);

    // The half of the picture the red square is in, painted in strokes of a 32-pixel brush.
    const redness = async (left: number) => {
      const [r, g] = await meanColour(source, left, 128);
      return r - g;
    };
    const painted = (await redness(0)) > (await redness(128)) ? 'left' : 'right';
    await page.fill('#brush', '32');
    const box = (await page.locator('#mask').boundingBox())!;
    const [from, to] = painted === 'left' ? [box.x, box.x + box.width / 2 - 16] : [box.x + box.width / 2 + 16, box.x + box.width];
    await page.mouse.move(from, box.y);
    await page.mouse.down();
    for (let y = 0; y <= box.height; y += 16) {
      await page.mouse.move(from, box.y + y);
      await page.mouse.move(to, box.y + y, { steps: 4 });
    }
    await page.mouse.up();
    await settings({ prompt: 'a blue square' });
    await page.fill('#strength', '1');
    await runAndWait('#edit-run');
    expect(await page.getAttribute('#results .result-image', 'alt')).toBe('Edit: a blue square (seed 3)');

    // Kept where nothing was painted, redrawn where the mask was painted (clear of the brush's edge).
    const edited = await imageBytes(page, '#results .result-image');
    const difference = async (left: number) => {
      const [a, b] = [await meanColour(edited, left, 112), await meanColour(source, left, 112)];
      return Math.hypot(...a.map((v, i) => v - b[i]));
    };
    const [paintedLeft, keptLeft] = painted === 'left' ? [0, 144] : [144, 0];
    expect(await difference(keptLeft)).toBeLessThan(3);
    expect(await difference(paintedLeft)).toBeGreaterThan(10);

    // Its code reads image.png and mask.png: the dialog offers both for download, the mask as painted.
    await page.click('#results button:has-text("Copy as code")');
    expect(await page.$$eval('#code-files a', (links) => links.map((a) => [a.textContent, a.getAttribute('download')]))).toEqual([
      ['Download image.png', 'image.png'],
      ['Download mask.png', 'mask.png'],
    ]);
    const maskBytes = Buffer.from(await page.$eval('#code-files a[download="mask.png"]', async (a) => Array.from(new Uint8Array(await (await fetch((a as HTMLAnchorElement).href)).arrayBuffer()))));
    const mask = await sharp(maskBytes).ensureAlpha().extractChannel(3).raw().toBuffer({ resolveWithObject: true });
    expect([mask.info.width, mask.info.height]).toEqual([256, 256]);
    const alpha = (x: number) => mask.data[128 * 256 + x];
    // Transparent (repainted) on the painted half, opaque (kept) on the other.
    expect(painted === 'left' ? [alpha(40), alpha(216)] : [alpha(216), alpha(40)]).toEqual([0, 255]);
    await page.keyboard.press('Escape');
  });

  it('sends no mask once every stroke was erased again, so the whole picture is redrawn', async () => {
    await page.click('#mask-clear');
    await page.fill('#brush', '16');
    await page.focus('#mask');
    await page.keyboard.press(' ');
    await page.check('#erase');
    await page.fill('#brush', '64');
    await page.focus('#mask');
    await page.keyboard.press(' ');
    await page.uncheck('#erase');
    // The form's parts as the page hands them to fetch (the browser does not show a streamed form's body).
    await page.evaluate(() => {
      const send = window.fetch;
      window.fetch = (input, init) => {
        if (init?.body instanceof FormData) (window as unknown as { parts: string[] }).parts = [...init.body.keys()];
        return send(input, init);
      };
    });
    await runAndWait('#edit-run');
    const parts = await page.evaluate(() => (window as unknown as { parts: string[] }).parts);
    expect(parts).toContain('image');
    expect(parts).not.toContain('mask');
  });

  it('says so beside the image field when a chosen file is no picture, and keeps the one it had', async () => {
    const before = await page.getAttribute('#source', 'src');
    await page.setInputFiles('#image', { name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('not a picture') });
    await expect.poll(() => page.textContent('#image-error')).toMatch(/^That image cannot be edited: it is not a picture this browser can read/);
    expect(await page.getAttribute('#image', 'aria-invalid')).toBe('true');
    expect(await page.getAttribute('#source', 'src')).toBe(before);
  });

  it('paints the mask from the keyboard: arrows move the brush, Space held down paints', async () => {
    await page.click('#mask-clear');
    await page.fill('#brush', '16');
    await page.focus('#mask');
    expect(await page.isVisible('#mask-cursor')).toBe(true);
    const alphaAt = (x: number, y: number) => page.$eval('#mask', (c, [px, py]) => (c as HTMLCanvasElement).getContext('2d')!.getImageData(px, py, 1, 1).data[3], [x, y]);
    const [w, h] = await page.$eval('#mask', (c) => [(c as HTMLCanvasElement).width, (c as HTMLCanvasElement).height]);
    // Moved without painting: nothing painted yet. Then Space down, right along, Space up.
    await page.keyboard.press('ArrowUp');
    expect(await alphaAt(w / 2, h / 2)).toBe(0);
    await page.keyboard.press('ArrowDown');
    await page.keyboard.down(' ');
    for (let i = 0; i < 6; i++) await page.keyboard.press('ArrowRight');
    await page.keyboard.up(' ');
    await page.keyboard.press('Shift+ArrowDown');
    expect(await alphaAt(w / 2, h / 2)).toBeGreaterThan(0);
    expect(await alphaAt(w / 2 + 20, h / 2)).toBeGreaterThan(0);
    // Not where the brush only moved, nor far from its way.
    expect(await alphaAt(w / 2, h / 2 + 40)).toBe(0);
    expect(await alphaAt(4, 4)).toBe(0);
    await page.click('#mask-clear');
    expect(await alphaAt(w / 2, h / 2)).toBe(0);
  });

  it('sends the edit on Enter in its Strength field, not a text-to-image generation that reads no strength', async () => {
    await page.fill('#strength', '0.5');
    await page.$eval('#status', (status) => (status.textContent = ''));
    const sent = page.waitForRequest((request) => request.method() === 'POST');
    await page.press('#strength', 'Enter');
    expect((await sent).url()).toBe(`${origin}/v1/images/edits`);
    await expect.poll(() => page.textContent('#status'), { timeout: 60_000 }).toMatch(/^Done: 1 image/);
    expect(await page.getAttribute('#results .result-image', 'alt')).toMatch(/^Edit: /);
  });

  it('makes variations of a result, answered with URLs whose time left shows in the history', async () => {
    await page.selectOption('#delivery', 'url');
    await runAndWait('#results button:has-text("Variations")');
    await page.selectOption('#delivery', 'stream');
    // Compared as a URL: the origin's [::1] would be a character class in a RegExp.
    const src = new URL((await page.getAttribute('#results .result-image', 'src'))!);
    expect([src.origin, src.pathname]).toEqual([origin, expect.stringMatching(/^\/v1\/images\/files\//)]);
    await expect.poll(() => page.textContent('#history li:first-child .expiry'), { timeout: 30_000 }).toMatch(/^URL expires in 23 h 59 min$/);
    if (process.env.PLAYGROUND_SCREENSHOT) await page.screenshot({ path: process.env.PLAYGROUND_SCREENSHOT, fullPage: true });
  });

  it('cancels a long request, and the server is free again', async () => {
    await settings({ size: '1024x1024', steps: '150', n: '2' });
    await page.click('#generate');
    // Its worker held from its first step until the page has cancelled: the request's fixed size alone (at
    // 128x128, as a machine 64 times as fast runs it) was done before the Enter, and the page said 'Done'.
    const resume = await holdBusyWorker(server.server.engine);
    try {
      await expect.poll(() => page.textContent('#status'), { timeout: 60_000 }).toMatch(/^Step \d+ of \d+/);
      expect(server.server.engine.load().running).toBe(1);
      expect(await page.evaluate(() => document.activeElement?.id)).toBe('cancel');
      await page.keyboard.press('Enter');
      await expect.poll(() => page.textContent('#status'), { timeout: 30_000 }).toContain('Cancelled');
    } finally {
      resume();
    }
    await expect.poll(() => server.server.engine.load(), { timeout: 30_000 }).toMatchObject({ running: 0, queued: 0 });
    // Free again: the next request runs at once.
    await settings({ size: '128x128', steps: '4', n: '1' });
    await runAndWait('#generate');
  });

  /** The values a select of the page offers. */
  const values = (select: string) => page.$$eval(`${select} option`, (options) => options.map((o) => (o as HTMLOptionElement).value));

  it('offers only the qualities and schedulers the chosen model takes under its name, as /v1/models lists them', async () => {
    const listed = async (id: string) => (await (await fetch(`${origin}/v1/models/${id}`, { headers: auth })).json()) as ModelObject;
    const shapes = await listed(MODEL);
    await page.selectOption('#model', MODEL);
    expect(await values('#quality')).toEqual(['', ...shapes.qualities]);
    expect(await values('#scheduler')).toEqual(['', ...shapes.schedulers]);
    expect(shapes.qualities).toEqual(expect.arrayContaining(['standard', 'hd']));
    // FLUX's sampler is not one an SD model takes: it was offered, and refused once sent.
    expect(shapes.schedulers).not.toContain('flow_match_euler');
    await page.selectOption('#quality', 'hd');
    await page.selectOption('#scheduler', shapes.schedulers[0]);
    // A gpt-image name takes neither dall-e's standard nor hd: the choice falls back to the model's default.
    await page.selectOption('#model', 'gpt-image-1');
    expect(await values('#quality')).toEqual(['', 'low', 'medium', 'high', 'auto']);
    expect(await page.inputValue('#quality')).toBe('');
    expect(await page.inputValue('#scheduler')).toBe(shapes.schedulers[0]);
    await page.selectOption('#quality', 'high');
    await page.selectOption('#model', MODEL);
    expect(await page.inputValue('#quality')).toBe('high');
    await page.selectOption('#quality', '');
    await page.selectOption('#scheduler', '');
  });

  it("offers GPT Image 2.5's qualities xhigh and max, and generates with them under its names", async () => {
    await page.selectOption('#model', 'gpt-image-2.5-flare');
    expect(await values('#quality')).toEqual(expect.arrayContaining(['xhigh', 'max']));
    for (const quality of ['xhigh', 'max']) {
      await page.selectOption('#quality', quality);
      await settings({ size: '128x128', steps: '4' });
      await runAndWait('#generate');
    }
    await page.selectOption('#quality', '');
    await page.selectOption('#model', MODEL);
  });

  it('shows the size an image was made at, streamed or with URLs, where the request asked for auto', async () => {
    await page.selectOption('#model', 'gpt-image-2');
    await settings({ size: 'auto', steps: '4' });
    for (const delivery of ['stream', 'url']) {
      await page.selectOption('#delivery', delivery);
      await runAndWait('#generate');
      // auto is the model's default size, 128x128.
      expect(await page.textContent('#results figcaption')).toMatch(/ · 128x128 · gpt-image-2 · /);
      expect(await page.textContent('#history li:first-child')).toContain(' · 128x128 · gpt-image-2 ');
    }
    await page.selectOption('#delivery', 'stream');
    await page.selectOption('#model', MODEL);
  });
});

describe.skipIf(!chromiumPath)(`the playground with PUBLIC_BASE_URL on another origin${chromiumPath ? '' : NO_CHROMIUM}`, () => {
  it("reads a result's picture, and its time left, through the page's own origin", async () => {
    // The URLs name an origin this page cannot read (here one that does not even resolve): the files
    // route is the same server's, reached at the page's own origin.
    const server = await startOpsServer({ env: { PUBLIC_BASE_URL: 'http://imagegen.invalid' } });
    let opened: Page | undefined;
    try {
      await untilReady(server.server.url, 60_000);
      const page = (opened = await openPlayground(browser, server.server.url, OPS_KEY));
      const done = (selector: string) => runOnPage(page, selector);
      await page.selectOption('#model', MODEL);
      await page.fill('#prompt', 'a red circle');
      await page.selectOption('#size', '128x128');
      await page.fill('#steps', '4');
      await done('#generate');
      // Variations answer with URLs on PUBLIC_BASE_URL's origin; variations of that result read it.
      await page.selectOption('#delivery', 'url');
      await done('#results .result:last-child button:has-text("Variations")');
      expect(await page.getAttribute('#results .result:last-child .result-image', 'src')).toMatch(/^http:\/\/imagegen\.invalid\/v1\/images\/files\//);
      await done('#results .result:last-child button:has-text("Variations")');
      await expect.poll(() => page.textContent('#history li:first-child .expiry'), { timeout: 30_000 }).toMatch(/^URL expires in 23 h 59 min$/);
    } finally {
      await opened?.context().close();
      await server.close();
    }
  });
});
