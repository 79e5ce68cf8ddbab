import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import type { AxeResults } from 'axe-core';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromiumPath, giveKey, NO_CHROMIUM, openKeyDialog, openPlayground, runOnPage } from './helpers/browser.js';
import { LONG, MODEL, OPS_KEY, startOpsServer, untilReady, type OpsServer } from './helpers/ops-server.js';

/**
 * The playground's accessibility in headless Chromium against the whole server: axe-core's rules on each
 * of the page's states (the key dialog, empty, a request running, results, an error, the edit panel with
 * a picture, the code dialog), and what axe cannot see: the keyboard alone.
 */

/** axe-core's browser build, run inside the page. */
const AXE = await readFile(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

/**
 * axe's violations of impact serious or critical on `page` as it is now, in the light and the dark colour
 * scheme, as lines naming the scheme, the rule and the elements. Injected through the DevTools protocol:
 * the page's Content-Security-Policy refuses an inline script (as it should), and a bypass of it would
 * test another page than the one served.
 */
async function serious(page: Page): Promise<string[]> {
  if (!(await page.evaluate(() => 'axe' in window))) await page.evaluate(AXE);
  const found: string[] = [];
  for (const colorScheme of ['light', 'dark'] as const) {
    await page.emulateMedia({ colorScheme });
    const violations = await page.evaluate(async () => {
      const { axe } = window as unknown as { axe: { run(context: Document): Promise<AxeResults> } };
      return (await axe.run(document)).violations.map(({ id, impact, help, nodes }) => ({ id, impact, help, targets: nodes.map((node) => node.target.join(' ')) }));
    });
    for (const { id, impact, help, targets } of violations) {
      if (impact === 'serious' || impact === 'critical') found.push(`${colorScheme}: ${id} (${impact}): ${help}: ${targets.join(', ')}`);
    }
  }
  await page.emulateMedia({ colorScheme: 'light' });
  return found;
}

/** What has the keyboard's focus: its id, else its accessible name or text, as a test names it. */
const focused = (page: Page) =>
  page.evaluate(() => {
    const element = document.activeElement;
    if (!element || element === document.body) return 'body';
    const radio = element instanceof HTMLInputElement && element.type === 'radio' ? `${element.name}=${element.value}` : '';
    return element.id || radio || element.getAttribute('aria-label') || element.textContent!.trim();
  });

/** Whether the focus is inside `dialog`, or in the browser's own controls ("body" to the page), as a modal dialog keeps it. */
const focusWithin = (page: Page, dialog: string) =>
  page.evaluate((selector) => document.activeElement === document.body || Boolean(document.activeElement?.closest(selector)), dialog);

/** How the focused element looks focused and unfocused, as its outline | its box shadow: a focus the eye sees changes them. */
function ring(page: Page): Promise<{ focused: string; unfocused: string }> {
  return page.evaluate(() => {
    const element = document.activeElement as HTMLElement;
    const look = () => {
      const style = getComputedStyle(element);
      return `${style.outlineStyle === 'none' ? 'none' : `${style.outlineStyle} ${style.outlineWidth} ${style.outlineColor} ${style.outlineOffset}`} | ${style.boxShadow}`;
    };
    const seen = look();
    element.blur();
    const unseen = look();
    element.focus({ focusVisible: true } as FocusOptions);
    return { focused: seen, unfocused: unseen };
  });
}

/** Presses Tab `times` times, with each focus it lands on and whether the eye sees it. */
async function tabs(page: Page, times: number): Promise<{ stop: string; visible: boolean }[]> {
  const stops: { stop: string; visible: boolean }[] = [];
  for (let i = 0; i < times; i++) {
    await page.keyboard.press('Tab');
    const stop = await focused(page);
    const look = stop === 'body' ? undefined : await ring(page);
    stops.push({ stop, visible: look !== undefined && look.focused !== look.unfocused && look.focused !== 'none | none' });
  }
  return stops;
}

/** What this test reads of an accessibility tree's node (the DevTools protocol's AXNode). */
interface AccessibleNode {
  description?: { value?: unknown };
  properties?: { name: string; value: { value?: unknown } }[];
}

/** The accessibility tree's node of `selector`, as Chromium gives it to a screen reader. */
async function accessibleNode(page: Page, selector: string): Promise<AccessibleNode> {
  const cdp = await page.context().newCDPSession(page);
  const { root } = await cdp.send('DOM.getDocument');
  const { nodeId } = await cdp.send('DOM.querySelector', { nodeId: root.nodeId, selector });
  const { nodes } = await cdp.send('Accessibility.getPartialAXTree', { nodeId, fetchRelatives: false });
  await cdp.detach();
  return nodes[0];
}

/**
 * What of the page a narrow screen, or a zoomed one, cuts off: the page's sideways scroll, elements that
 * reach past the screen's edges, selects too narrow for the option they show (its text beside the arrow
 * Chromium draws, about 20 px with its padding), and the history's lines broken inside a word.
 */
function cutOff(page: Page): Promise<string[]> {
  return page.evaluate(() => {
    const width = document.documentElement.clientWidth;
    const cut: string[] = [];
    if (document.documentElement.scrollWidth > width) cut.push(`the page scrolls sideways by ${document.documentElement.scrollWidth - width} px`);
    const name = (element: Element) => `${element.tagName.toLowerCase()}${element.id ? `#${element.id}` : ''}${element.className ? `.${element.className}` : ''}`;
    for (const element of document.querySelectorAll('body *')) {
      const box = element.getBoundingClientRect();
      if (box.width === 0 || element.closest('.visually-hidden, .skip')) continue;
      if (box.left < -0.5 || box.right > width + 0.5) cut.push(`${name(element)} reaches ${Math.round(box.left)}..${Math.round(box.right)}`);
    }
    const measure = document.createElement('canvas').getContext('2d')!;
    for (const select of document.querySelectorAll('select')) {
      if (select.getClientRects().length === 0) continue;
      measure.font = getComputedStyle(select).font;
      const text = select.selectedOptions[0]?.text ?? '';
      if (measure.measureText(text).width + 20 > select.clientWidth) cut.push(`select#${select.id} shows "${text}" cut`);
    }
    for (const word of document.querySelectorAll('#history li > span')) {
      const range = document.createRange();
      const text = word.firstChild;
      if (!text) continue;
      for (const match of text.textContent!.matchAll(/\S+/g)) {
        range.setStart(text, match.index);
        range.setEnd(text, match.index + match[0].length);
        if (range.getClientRects().length > 1 && match[0].length < 20) cut.push(`"${match[0]}" broken in the history`);
      }
    }
    return cut;
  });
}

describe.skipIf(!chromiumPath)(`the playground's accessibility in headless Chromium${chromiumPath ? '' : NO_CHROMIUM}`, () => {
  let server: OpsServer;
  let origin: string;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    server = await startOpsServer();
    origin = server.server.url;
    await untilReady(origin, 60_000);
    browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox'] });
    page = await openPlayground(browser, origin, OPS_KEY, { viewport: { width: 1280, height: 900 } });
    await page.selectOption('#model', MODEL);
    await page.fill('#steps', '2');
  });

  afterAll(async () => {
    await browser?.close();
    await server?.close();
  });

  it("breaks none of axe's serious or critical rules in any of the page's states", async () => {
    const found: Record<string, string[]> = {};
    const tab = await openKeyDialog(browser, origin);
    found['key dialog'] = await serious(tab);
    await tab.context().close();
    found.empty = await serious(page);
    // Running: the status line, the progress bar and the previews.
    await page.selectOption('#size', LONG.size);
    await page.fill('#steps', String(LONG.steps));
    await page.click('#generate');
    await expect.poll(() => page.isVisible('#previews img'), { timeout: 60_000 }).toBe(true);
    found.running = await serious(page);
    await page.click('#cancel');
    await expect.poll(() => page.textContent('#status')).toMatch(/^Cancelled/);
    await page.selectOption('#size', '128x128');
    await page.fill('#steps', '2');
    await page.fill('#n', '2');
    await runOnPage(page, '#generate', /^Done: 2 images/);
    found.results = await serious(page);
    await page.fill('#steps', '151');
    await runOnPage(page, '#generate', /^Failed/);
    found.error = await serious(page);
    await page.fill('#steps', '2');
    await page.click('#results button:has-text("Edit")');
    await expect.poll(() => page.evaluate(() => document.activeElement?.id)).toBe('mask');
    found['edit panel'] = await serious(page);
    await page.click('#results button:has-text("Copy as code")');
    found['code dialog'] = await serious(page);
    await page.keyboard.press('Escape');
    await page.fill('#n', '1');
    expect(found).toEqual(Object.fromEntries(Object.keys(found).map((state) => [state, []])));
  });

  it('works from the keyboard alone: every control in order with a focus the eye sees, Generate, the results, both dialogs', async () => {
    const tab = await openPlayground(browser, origin, OPS_KEY, { viewport: { width: 1280, height: 900 } });
    // From the top of the page (the key is the tab's: no dialog this time).
    await tab.reload();
    await expect.poll(() => tab.inputValue('#model')).toBe(MODEL);
    const form = await tabs(tab, 20);
    expect(form.map(({ stop }) => stop)).toEqual([
      'Skip to the prompt', 'key-open', 'prompt', 'negative_prompt', 'model', 'size', 'n', 'quality', 'style', 'steps', 'guidance_scale',
      'seed_mode=random', 'seed', 'scheduler', 'output_format', 'delivery', 'partial_images', 'image', 'strength', 'generate',
    ]);
    expect(form.filter(({ visible }) => !visible)).toEqual([]);
    // The skip link goes to the prompt.
    await tab.reload();
    await tab.keyboard.press('Tab');
    await tab.keyboard.press('Enter');
    expect(await focused(tab)).toBe('prompt');

    // Generate with Space, then with Enter; the focus goes to the new image's first link, and its actions follow.
    await tab.selectOption('#size', '128x128');
    await tab.fill('#steps', '2');
    for (const key of ['Space', 'Enter']) {
      await tab.focus('#generate');
      await tab.$eval('#status', (status) => (status.textContent = ''));
      await tab.keyboard.press(key);
      await expect.poll(() => tab.textContent('#status'), { timeout: 60_000 }).toMatch(/^Done: 1 image/);
      expect(await focused(tab)).toMatch(/^Open image 1, seed \d+ full size$/);
    }
    const actions = await tabs(tab, 5);
    expect(actions.map(({ stop }) => stop.replace(/image 1, seed \d+/, 'image 1'))).toEqual([
      'Download image 1', 'Reuse settings of image 1', 'Edit image 1', 'Variations of image 1', 'Copy as code: image 1',
    ]);
    expect(actions.filter(({ visible }) => !visible)).toEqual([]);

    // The code dialog keeps the focus inside it (or in the browser's own controls), Escape
    // closes it, and the focus goes back to the button that opened it.
    await tab.keyboard.press('Enter');
    await tab.waitForSelector('#code-dialog[open]');
    for (let i = 0; i < 12; i++) {
      expect(await focusWithin(tab, '#code-dialog')).toBe(true);
      await tab.keyboard.press('Tab');
    }
    await tab.keyboard.press('Escape');
    expect(await tab.isVisible('#code-dialog')).toBe(false);
    expect(await focused(tab)).toMatch(/^Copy as code: image 1/);
    // So the key dialog, opened from its button.
    await tab.focus('#key-open');
    await tab.keyboard.press('Enter');
    expect(await focused(tab)).toBe('key');
    for (let i = 0; i < 6; i++) {
      await tab.keyboard.press('Tab');
      expect(await focusWithin(tab, '#key-dialog')).toBe(true);
    }
    await tab.keyboard.press('Escape');
    expect(await tab.isVisible('#key-dialog')).toBe(false);
    expect(await focused(tab)).toBe('key-open');

    // A field the server refused has the focus, with the ring of any focused field: its red outline took
    // the ring's place, the same focused or not but for 2 pixels of offset, and hid where the focus was.
    await tab.focus('#steps');
    const valid = await ring(tab);
    await tab.fill('#steps', '151');
    await tab.focus('#generate');
    await tab.keyboard.press('Enter');
    await expect.poll(() => focused(tab), { timeout: 30_000 }).toBe('steps');
    const outline = (look: string) => look.split(' | ')[0];
    const invalid = await ring(tab);
    expect(outline(invalid.focused)).toBe(outline(valid.focused));
    expect(outline(invalid.unfocused)).not.toBe(outline(valid.unfocused));
    // A screen reader has it invalid, described by the message.
    const steps = await accessibleNode(tab, '#steps');
    expect(steps.properties?.find(({ name }) => name === 'invalid')?.value.value).toBe('true');
    expect(steps.description?.value).toMatch(/^Invalid 'steps'/);
    await tab.fill('#steps', '2');

    // A key refused in a request's answer (revoked since the tab took it): the dialog asks for one, and
    // once it is given the focus is back on Generate to send it again, not at the top of the page.
    await tab.evaluate(() => sessionStorage.setItem('imagegen.apiKey', 'sk-revoked-0123456789'));
    await tab.focus('#generate');
    await tab.keyboard.press('Enter');
    await tab.waitForSelector('#key-dialog[open]');
    expect(await focused(tab)).toBe('key');
    await tab.keyboard.press('Control+A');
    await tab.keyboard.type(OPS_KEY);
    await tab.keyboard.press('Enter');
    await tab.waitForSelector('#key-dialog:not([open])', { state: 'attached' });
    expect(await focused(tab)).toBe('generate');
    await tab.context().close();
  });

  it('reads the step count out now and then while it shows each step: not one announcement a step', async () => {
    // Each change of the status line, as shown and as a screen reader has it (the accessibility tree
    // leaves out what is aria-hidden), with its time.
    await page.evaluate(() => {
      const status = document.getElementById('status')!;
      const changes: { ms: number; shown: string; spoken: string }[] = [];
      const spoken = () => {
        const copy = status.cloneNode(true) as HTMLElement;
        for (const hidden of copy.querySelectorAll('[aria-hidden=true]')) hidden.remove();
        return copy.textContent!;
      };
      // On the screen: its first sentence (the copy kept for screen readers is clipped out of sight).
      const shown = () => /^[^.]*\.?/.exec(status.textContent!)![0];
      new MutationObserver(() => changes.push({ ms: performance.now(), shown: shown(), spoken: spoken() })).observe(status, { subtree: true, childList: true, characterData: true });
      Object.assign(window, { changes });
    });
    await page.selectOption('#size', LONG.size);
    await page.fill('#steps', String(LONG.steps));
    await page.click('#generate');
    await expect.poll(() => page.textContent('#status'), { timeout: 60_000 }).toMatch(/^Step (1\d|[2-9]\d|1\d\d) of/);
    // The accessibility tree has the count last spoken, not the one shown (polled: both move as it is read).
    const treeHasSpoken = async () => {
      const { shown, spoken } = await page.evaluate(() => (window as unknown as { changes: { shown: string; spoken: string }[] }).changes.at(-1)!);
      const tree = await page.locator('#status').ariaSnapshot();
      return tree.includes(spoken) && (shown === spoken || !tree.includes(shown));
    };
    await expect.poll(treeHasSpoken, { timeout: 10_000 }).toBe(true);
    await page.click('#cancel');
    await expect.poll(() => page.textContent('#status')).toMatch(/^Cancelled/);
    const changes = await page.evaluate(() => (window as unknown as { changes: { ms: number; shown: string; spoken: string }[] }).changes);
    const during = changes.filter(({ shown }) => shown.startsWith('Step '));
    const stepOf = (text: string) => Number(/^Step (\d+)/.exec(text)![1]);
    const spoken = during.filter(({ spoken }, i) => spoken !== (i ? during[i - 1].spoken : ''));
    // Every step shown, the first read out at once, then one every 5 s at most.
    expect(stepOf(during.at(-1)!.shown) - stepOf(during[0].shown)).toBeGreaterThanOrEqual(9);
    expect(spoken[0].spoken).toBe(during[0].shown);
    expect(spoken.length).toBeLessThanOrEqual(1 + Math.floor((during.at(-1)!.ms - during[0].ms) / 5000));
    for (const { spoken: text } of spoken) expect(text).toMatch(/^Step \d+ of \d+\.$/);
    // The end is read out as it comes.
    expect(changes.at(-1)!.spoken).toBe('Cancelled: the server stopped the work.');
    await page.selectOption('#size', '128x128');
    await page.fill('#steps', '2');
  });

  it("fits 320 and 640 pixels (1280 at 400% and 200% zoom) and a desktop's width in every state, cutting nothing off", async () => {
    const found: Record<string, string[]> = {};
    for (const width of [320, 640, 1280]) {
      const tab = await openKeyDialog(browser, origin, { viewport: { width, height: 800 } });
      found[`${width}: key dialog`] = await cutOff(tab);
      await giveKey(tab, OPS_KEY);
      await expect.poll(() => tab.inputValue('#model')).toBe(MODEL);
      found[`${width}: empty`] = await cutOff(tab);
      await tab.selectOption('#size', '128x128');
      await tab.fill('#steps', '2');
      await runOnPage(tab, '#generate');
      found[`${width}: results`] = await cutOff(tab);
      await tab.fill('#steps', '151');
      await runOnPage(tab, '#generate', /^Failed/);
      found[`${width}: error`] = await cutOff(tab);
      await tab.fill('#steps', '2');
      await tab.click('#results button:has-text("Edit")');
      await expect.poll(() => tab.evaluate(() => document.activeElement?.id)).toBe('mask');
      found[`${width}: edit panel`] = await cutOff(tab);
      await tab.click('#results button:has-text("Copy as code")');
      found[`${width}: code dialog`] = await cutOff(tab);
      await tab.context().close();
    }
    expect(found).toEqual(Object.fromEntries(Object.keys(found).map((state) => [state, []])));
  });
});
