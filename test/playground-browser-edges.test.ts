import { rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { chromium, type Browser, type Page, type Request } from 'playwright-core';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromiumPath, giveKey, NO_CHROMIUM, openKeyDialog, openPlayground, runOnPage } from './helpers/browser.js';
import { LONG, makeRoot, MODEL, OPS_KEY, rootEnv, untilReady } from './helpers/ops-server.js';
import { killServer, spawnServer, type ServerProcess } from './helpers/server-process.js';

/**
 * The playground at its edges, in headless Chromium against `imagegen serve` as a process of its own:
 * a phone's screen and a very long prompt; and last the server dying under the page as a crash or a
 * restart kills it.
 */

/** How far the page reaches right of the screen, in CSS pixels (0: no sideways scrolling). */
const overflow = (page: Page) => page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);

/** WCAG's contrast ratio of two CSS colours as getComputedStyle gives them (`rgb(r, g, b)`). */
function contrast(a: string, b: string): number {
  const luminance = (colour: string) => {
    const [r, g, b] = colour.match(/\d+/g)!.slice(0, 3).map((v) => {
      const c = Number(v) / 255;
      return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const [light, dark] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (light + 0.05) / (dark + 0.05);
}

/**
 * How many of the page's live regions a screen reader would read `text` from, as the accessibility tree
 * has them (aria-hidden parts left out): each is one announcement.
 */
async function timesAnnounced(page: Page, text: string): Promise<number> {
  const regions = await page.locator('[role=status], [role=alert], [aria-live=polite], [aria-live=assertive]').all();
  let times = 0;
  for (const region of regions) if ((await region.isVisible()) && (await region.ariaSnapshot()).includes(text)) times++;
  return times;
}

describe.skipIf(!chromiumPath)(`the playground at its edges${chromiumPath ? '' : NO_CHROMIUM}`, () => {
  let root: string;
  let server: ServerProcess;
  let browser: Browser;
  let page: Page;
  /** The page's uncaught errors: each is a failure the page did not show its user. */
  const uncaught: string[] = [];

  beforeAll(async () => {
    root = await makeRoot();
    // Sizes of three shapes, for an edit's picture to match or be cropped to.
    const sizes = ['128x128', '192x128', '128x192', '256x256', '512x512', '1024x1024'];
    await writeFile(path.join(root, 'models', MODEL, 'imagegen.json'), JSON.stringify({ sizes, default_size: '128x128' }));
    // A store too small for ten 1024x1024 images: answers with URLs of those are refused (507).
    server = await spawnServer({ ...rootEnv(root), PORT: '0', MAX_STORE_BYTES: '1m' });
    await untilReady(server.origin, 60_000);
    browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox'] });
    page = await openPlayground(browser, server.origin, OPS_KEY);
    page.on('pageerror', (err) => uncaught.push(err.message));
    await page.selectOption('#model', MODEL);
  });

  afterAll(async () => {
    await browser?.close();
    if (server) await killServer(server);
    if (root) await rm(root, { recursive: true, force: true });
  });

  it("fits a phone's screen, and a very long prompt neither widens the page nor fills the history", async () => {
    const phone = await openPlayground(browser, server.origin, OPS_KEY, { viewport: { width: 375, height: 740 } });
    expect(await overflow(phone)).toBe(0);
    // A long prompt with a word longer than any screen is wide, asked for twice.
    const prompt = `a red circle ${'x'.repeat(3000)}`;
    await phone.fill('#prompt', prompt);
    await phone.selectOption('#model', MODEL);
    await phone.selectOption('#size', '128x128');
    await phone.fill('#steps', '2');
    await phone.fill('#n', '2');
    await runOnPage(phone, '#generate', /^Done: 2 images/);
    expect(await overflow(phone)).toBe(0);
    // Its alt text and its history line give the prompt's start, not all of it for each image.
    const alt = (await phone.getAttribute('#results .result-image', 'alt'))!;
    expect(alt.startsWith('a red circle xxx')).toBe(true);
    expect(alt.length).toBeLessThan(250);
    expect((await phone.textContent('#history li'))!.length).toBeLessThan(400);
    // The thumbnail's line says what it is: no alt text to read twice.
    expect(await phone.getAttribute('#history li img', 'alt')).toBe('');
    await phone.click('#results button:has-text("Copy as code")');
    expect(await phone.$eval('#code-dialog', (dialog) => dialog.getBoundingClientRect().right)).toBeLessThanOrEqual(375);
    await phone.keyboard.press('Escape');
    // On a wide screen the settings keep their column: the results do not cover them.
    await phone.setViewportSize({ width: 1280, height: 900 });
    expect(await overflow(phone)).toBe(0);
    const right = await phone.$eval('#settings', (form) => form.getBoundingClientRect().right);
    expect(await phone.$eval('#run', (run) => run.getBoundingClientRect().left)).toBeGreaterThan(right);
    await phone.context().close();
  });

  it('shows an error in a colour that reads (4.5:1, WCAG AA) on the light and the dark scheme alike', async () => {
    await page.fill('#steps', '151');
    await runOnPage(page, '#generate', /^Failed: Invalid 'steps'/);
    // Shown in the status line and beside the field, read out once.
    expect(await timesAnnounced(page, "Invalid 'steps'")).toBe(1);
    for (const colorScheme of ['light', 'dark'] as const) {
      await page.emulateMedia({ colorScheme });
      // The page's background, or where it sets none the browser's own for the scheme (its Canvas colour).
      const [text, background] = await page.evaluate(() => {
        const probe = document.body.appendChild(Object.assign(document.createElement('div'), { style: 'background: Canvas' }));
        const own = getComputedStyle(document.documentElement).backgroundColor;
        const canvas = getComputedStyle(probe).backgroundColor;
        probe.remove();
        return [getComputedStyle(document.getElementById('steps-error')!).color, own === 'rgba(0, 0, 0, 0)' ? canvas : own];
      });
      expect(contrast(text, background), `${colorScheme}: ${text} on ${background}`).toBeGreaterThanOrEqual(4.5);
    }
    await page.emulateMedia({ colorScheme: 'light' });
  });

  it("says what to do in the page's own terms when the image store refuses an answer with URLs", async () => {
    await page.selectOption('#size', '1024x1024');
    await page.fill('#steps', '2');
    await page.fill('#n', '10');
    await page.selectOption('#delivery', 'url');
    await runOnPage(page, '#generate', /^Failed: /);
    expect(await page.textContent('#form-error')).toMatch(/more than the whole store holds .* In this page: set "Answer as" to stream, which keeps nothing on the server\.$/);
    expect(await timesAnnounced(page, 'more than the whole store holds')).toBe(1);
    // Variations, which are never streamed, too: asked for with URLs they are refused with the same advice,
    // and with "Answer as" stream they come inline (they were always asked for with URLs: no way round).
    const square = await sharp({ create: { width: 128, height: 128, channels: 3, background: '#808080' } }).png().toBuffer();
    await page.setInputFiles('#image', { name: 'square.png', mimeType: 'image/png', buffer: square });
    await page.fill('#steps', '');
    await runOnPage(page, '#variations-run', /^Failed: /);
    expect(await page.textContent('#form-error')).toMatch(/more than the whole store holds .* In this page: set "Answer as" to stream, which keeps nothing on the server\.$/);
    await page.selectOption('#delivery', 'stream');
    await runOnPage(page, '#variations-run', /^Done: 10 images/);
    expect(await page.getAttribute('#results .result-image', 'src')).toMatch(/^blob:/);
    expect(await page.textContent('#history li:first-child .expiry')).toBe('inline: kept in this tab only');
    await page.fill('#n', '1');
  });

  it("brings a result's picture into view with the focus on it when Edit takes it to the edit panel", async () => {
    await page.selectOption('#size', '128x128');
    await page.fill('#steps', '2');
    await runOnPage(page, '#generate');
    await page.click('#results button:has-text("Edit")');
    await expect.poll(() => page.evaluate(() => document.activeElement?.id)).toBe('mask');
    // All of the picture on the screen, to paint on.
    const { top, bottom } = await page.$eval('#mask', (mask) => mask.getBoundingClientRect().toJSON() as DOMRect);
    expect(top).toBeGreaterThanOrEqual(0);
    expect(bottom).toBeLessThanOrEqual(page.viewportSize()!.height);
    expect(bottom - top).toBe(128);
  });

  it("sets the size to the shape of a picture chosen to edit, and says and shades what a size of another shape crops", async () => {
    await page.selectOption('#size', '128x128');
    const wide = await sharp({ create: { width: 384, height: 256, channels: 3, background: '#808080' } }).png().toBuffer();
    await page.setInputFiles('#image', { name: 'wide.png', mimeType: 'image/png', buffer: wide });
    await expect.poll(() => page.inputValue('#size')).toBe('192x128');
    expect(await page.textContent('#status')).toBe("Size set to 192x128 to match the picture's shape (384x256).");
    expect(await page.isVisible('.crop-cut >> nth=0')).toBe(false);
    // Square: the server keeps the middle 256x256 of it (docs/api.md), a sixth of its width cut off each side.
    await page.selectOption('#size', '128x128');
    const said = /^The picture to edit \(384x256\) is of another shape: it will be cropped to 128x128, losing its shaded left and right edges, mask included\.$/;
    expect(await page.textContent('#status')).toMatch(said);
    expect(await page.textContent('#size-help')).toMatch(said);
    const mask = (await page.locator('#mask').boundingBox())!;
    const [left, right] = await page.$$eval('.crop-cut', (bands) => bands.map((band) => band.getBoundingClientRect().toJSON() as DOMRect));
    for (const [band, x] of [[left, mask.x], [right, mask.x + (mask.width * 5) / 6]] as const) {
      expect([band.x, band.y, band.width, band.height].map(Math.round)).toEqual([x, mask.y, mask.width / 6, mask.height].map(Math.round));
    }
    // Its shape again: nothing cut, nothing shaded.
    await page.selectOption('#size', '192x128');
    expect(await page.textContent('#size-help')).toBe('');
    expect(await page.isVisible('.crop-cut >> nth=1')).toBe(false);
    // Another model that lacks 192x128: its size of the picture's shape, not its square default (which
    // cropped the picture though the model has its shape), and back again.
    await page.selectOption('#model', 'demo-shapes');
    expect(await page.inputValue('#size')).toBe('768x512');
    expect(await page.textContent('#status')).toBe("Size set to 768x512 to match the picture's shape (384x256).");
    expect(await page.isVisible('.crop-cut >> nth=0')).toBe(false);
    await page.selectOption('#model', MODEL);
    expect(await page.inputValue('#size')).toBe('192x128');
    // A name without a size of its shape (gpt-image-1 here: auto and 1024x1024): its nearest, not said to match.
    await page.selectOption('#model', 'gpt-image-1');
    expect(await page.inputValue('#size')).toBe('1024x1024');
    expect(await page.textContent('#status')).toBe(
      "Size set to 1024x1024, the nearest this model has to the picture's shape (384x256). The picture to edit (384x256) is of another shape: it will be cropped to 1024x1024, losing its shaded left and right edges, mask included.",
    );
    await page.selectOption('#model', MODEL);
    await page.selectOption('#size', '192x128');
  });

  it("keeps the prompt when the settings of a variation, which has none, are reused", async () => {
    await page.fill('#prompt', 'a prompt being written');
    await page.fill('#negative_prompt', 'blurry');
    await page.fill('#steps', '4');
    await runOnPage(page, '#variations-run');
    await page.click('#results button:has-text("Reuse settings")');
    expect(await page.inputValue('#prompt')).toBe('a prompt being written');
    expect(await page.inputValue('#negative_prompt')).toBe('blurry');
    // What a variation has is reused: its seed, its size.
    const seed = await page.getAttribute('#results .result-image', 'data-seed');
    expect(await page.inputValue('#seed')).toBe(seed);
    expect(await page.inputValue('#size')).toBe('192x128');
    await page.fill('#prompt', 'a red circle');
    await page.fill('#negative_prompt', '');
  });

  it('says that a number field holds no number, rather than send the model\'s default unseen; so a seed fixed with none', async () => {
    const posts: string[] = [];
    const count = (request: Request) => void (request.method() === 'POST' && posts.push(request.url()));
    page.on('request', count);
    // A number field gives an empty value for text that is no number: the request left it out.
    await page.fill('#steps', '');
    await page.focus('#steps');
    await page.keyboard.type('1e');
    await page.click('#generate');
    expect(await page.textContent('#steps-error')).toMatch(/^This is not a number: type it in digits/);
    expect(await page.getAttribute('#steps', 'aria-invalid')).toBe('true');
    expect(await page.evaluate(() => document.activeElement?.id)).toBe('steps');
    await page.fill('#steps', '2');
    await page.check('input[name=seed_mode][value=fixed]');
    await page.fill('#seed', '');
    await page.click('#generate');
    expect(await page.textContent('#seed-error')).toBe('Type the seed to fix, or choose random.');
    expect(posts).toEqual([]);
    page.off('request', count);
    await page.check('input[name=seed_mode][value=random]');
    await runOnPage(page, '#generate');
  });

  it('keeps the settings over a reload of the tab, and asks before a reload drops a running request', async () => {
    const tab = await openPlayground(browser, server.origin, OPS_KEY);
    const settings = { '#prompt': 'a prompt written at length', '#n': '3', '#steps': '5', '#seed': '1234' };
    const choices = { '#model': 'demo-shapes', '#size': '768x512', '#quality': 'hd', '#scheduler': 'ddim', '#output_format': 'webp', '#delivery': 'url', '#partial_images': '3' };
    for (const [selector, value] of Object.entries(choices)) await tab.selectOption(selector, value);
    for (const [selector, value] of Object.entries(settings)) await tab.fill(selector, value);
    await tab.reload();
    // The key too (the tab's): no dialog, and the model's lists filled before its choices came back.
    await expect.poll(() => tab.inputValue('#model')).toBe('demo-shapes');
    expect(await tab.isVisible('#key-dialog')).toBe(false);
    for (const [selector, value] of Object.entries({ ...settings, ...choices })) expect(await tab.inputValue(selector), selector).toBe(value);
    expect(await tab.isChecked('input[name=seed_mode][value=fixed]')).toBe(true);
    // A reload while a request runs: asked first, and staying keeps it running.
    for (const [selector, value] of Object.entries({ '#model': MODEL, '#delivery': 'stream', '#size': LONG.size })) await tab.selectOption(selector, value);
    await tab.fill('#steps', String(LONG.steps));
    await tab.fill('#n', String(LONG.n));
    await tab.click('#generate');
    await expect.poll(() => tab.textContent('#status'), { timeout: 60_000 }).toMatch(/^Step \d+ of \d+/);
    const asked = new Promise<string>((resolve) => tab.once('dialog', (dialog) => void dialog.dismiss().then(() => resolve(dialog.type()))));
    await tab.evaluate(() => location.reload());
    expect(await asked).toBe('beforeunload');
    await tab.click('#cancel');
    await expect.poll(() => tab.textContent('#status'), { timeout: 30_000 }).toBe('Cancelled: the server stopped the work.');
    await tab.context().close();
  });

  it('forgets the key when asked, and asks for one without saying that none was refused', async () => {
    const tab = await openKeyDialog(browser, server.origin);
    expect(await tab.isVisible('#key-forget')).toBe(false);
    // Closed without a key, then a request: the dialog again, saying what it said at first.
    await tab.keyboard.press('Escape');
    await tab.click('#generate');
    await tab.waitForSelector('#key-dialog[open]');
    expect(await tab.textContent('#key-error')).toBe('');
    expect(await tab.textContent('#key-state')).toBe('This server needs an API key.');
    await giveKey(tab, OPS_KEY);
    await tab.click('#key-open');
    await tab.click('#key-forget');
    await expect.poll(() => tab.evaluate(() => sessionStorage.getItem('imagegen.apiKey'))).toBeNull();
    // The dialog said so before Forget too (opened by its button): the field and the button show the
    // answer of the server asked again, which comes a moment after the key is gone from the tab.
    await expect.poll(() => tab.inputValue('#key')).toBe('');
    await expect.poll(() => tab.isVisible('#key-forget')).toBe(false);
    expect(await tab.textContent('#key-state')).toBe('This server needs an API key.');
    expect(await tab.isVisible('#key-dialog')).toBe(true);
    // Gone for a reload too.
    await tab.reload();
    await tab.waitForSelector('#key-dialog[open]');
    await tab.context().close();
  });

  it("names an edit's picture by its own format in the form and in the code's files: a WebP result is image.webp", async () => {
    await page.selectOption('#output_format', 'webp');
    await runOnPage(page, '#generate');
    await page.click('#results button:has-text("Edit")');
    await expect.poll(() => page.evaluate(() => document.activeElement?.id)).toBe('mask');
    await runOnPage(page, '#edit-run');
    await page.click('#results button:has-text("Copy as code")');
    const link = '#code-files a[download="image.webp"]';
    const head = await page.$eval(link, async (a) => new TextDecoder().decode((await (await fetch((a as HTMLAnchorElement).href)).arrayBuffer()).slice(0, 12)));
    expect(head).toMatch(/^RIFF....WEBP$/s);
    for (const [language, reads] of [['curl', '-F image=@image.webp'], ['python', 'image=open("image.webp", "rb")'], ['node', "image: await toFile(fs.createReadStream('image.webp'), 'image.webp')"]]) {
      expect(await page.textContent(`#code-${language}`)).toContain(reads);
    }
    await page.keyboard.press('Escape');
    await page.selectOption('#output_format', 'png');
  });

  it('says how to run the Node snippet, and Ctrl+Enter in the code dialog sends nothing behind it', async () => {
    await page.click('#results button:has-text("Copy as code")');
    // ES-module JavaScript (import, top-level await): node runs it only as .mjs or under "type": "module".
    expect((await page.textContent('#code-node'))!.split('\n')[0]).toMatch(/^\/\/ .*\.mjs/);
    // send() says "Sending…" before its first await: had the shortcut sent, the status would say so now.
    await page.$eval('#status', (status) => (status.textContent = 'before'));
    await page.focus('#code-node');
    await page.keyboard.press('Control+Enter');
    expect(await page.textContent('#status')).toBe('before');
    expect(await page.isVisible('#code-dialog')).toBe(true);
    await page.keyboard.press('Escape');
  });

  it('says that the connection was lost, and what to do, when the server dies in the middle of a stream', async () => {
    await page.selectOption('#size', LONG.size);
    await page.fill('#steps', String(LONG.steps));
    await page.fill('#n', String(LONG.n));
    await page.click('#generate');
    await expect.poll(() => page.textContent('#status'), { timeout: 60_000 }).toMatch(/^Step \d+ of \d+/);
    await killServer(server);
    await expect
      .poll(() => page.textContent('#status'), { timeout: 30_000 })
      .toBe('Failed: The connection to the server was lost after 0 of 2 images (network error): check that the server is running and reachable, then try again.');
    expect(uncaught).toEqual([]);
    // The keyboard's focus back on Generate, to send it again: not on the earlier request's image.
    expect(await page.evaluate(() => document.activeElement?.id)).toBe('generate');
    // Sent again while it is down: not reached at all, said so with the same advice.
    await page.click('#generate');
    await expect.poll(() => page.textContent('#form-error'), { timeout: 30_000 }).toMatch(/^The server could not be reached \(.+\): check that the server is running and reachable, then try again\.$/);
  });
});
