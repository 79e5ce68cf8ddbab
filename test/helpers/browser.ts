import { existsSync } from 'node:fs';
import type { Browser, BrowserContextOptions, Page } from 'playwright-core';
import { expect } from 'vitest';

/**
 * A Chromium for the browser tests: Debian's `chromium` (`apt-get install chromium`, as .ci/run does),
 * driven by playwright-core, which downloads no browser of its own. CHROMIUM_PATH names another one.
 */

const CANDIDATES = ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome', '/usr/bin/google-chrome-stable'];

export const chromiumPath: string | undefined = [process.env.CHROMIUM_PATH, ...CANDIDATES].find((file): file is string => Boolean(file && existsSync(file)));

/** The skip reason tests put in their names, so `npm test` says why they did not run. */
export const NO_CHROMIUM = ' (skipped: chromium not found, install it with `apt-get install chromium` or set CHROMIUM_PATH)';

if (!chromiumPath) console.warn(`browser tests${NO_CHROMIUM}`);

/**
 * A new page (its own context: its own sessionStorage) on the playground at `origin`, as a first visit
 * finds it: the key dialog open.
 */
export async function openKeyDialog(browser: Browser, origin: string, options: BrowserContextOptions = {}): Promise<Page> {
  const page = await (await browser.newContext(options)).newPage();
  await page.goto(`${origin}/`);
  await page.waitForSelector('#key-dialog[open]', { timeout: 30_000 });
  return page;
}

/** Gives `key` in `page`'s open key dialog; resolves once the dialog has closed, the key taken and the models listed. */
export async function giveKey(page: Page, key: string): Promise<void> {
  await page.fill('#key', key);
  await page.click('#key-save');
  await page.waitForSelector('#key-dialog:not([open])', { state: 'attached', timeout: 30_000 });
}

/** A new page on the playground at `origin` (openKeyDialog), given `key` (giveKey). */
export async function openPlayground(browser: Browser, origin: string, key: string, options: BrowserContextOptions = {}): Promise<Page> {
  const page = await openKeyDialog(browser, origin, options);
  await giveKey(page, key);
  return page;
}

/**
 * Clicks a button of `page` that sends a request and waits for the page to say that it is done (a fresh
 * status, not the last one), then expects it to have said `done`.
 */
export async function runOnPage(page: Page, selector: string, done: RegExp = /^Done: 1 image/): Promise<void> {
  await page.$eval('#status', (status) => (status.textContent = ''));
  await page.click(selector);
  await expect.poll(() => page.textContent('#status'), { timeout: 60_000 }).toMatch(/^(Done|Failed)/);
  expect(await page.textContent('#status')).toMatch(done);
}
