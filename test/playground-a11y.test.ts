import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import type { AxeResults } from 'axe-core';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromiumPath, NO_CHROMIUM, openPlayground, runOnPage } from './helpers/browser.js';
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
    const tab = await (await browser.newContext()).newPage();
    await tab.goto(`${origin}/`);
    await tab.waitForSelector('#key-dialog[open]');
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
});
