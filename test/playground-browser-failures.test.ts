import { rm } from 'node:fs/promises';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromiumPath, NO_CHROMIUM, openPlayground } from './helpers/browser.js';
import { LONG, makeRoot, MODEL, OPS_KEY, rootEnv, untilReady } from './helpers/ops-server.js';
import { killServer, spawnServer, type ServerProcess } from './helpers/server-process.js';

/**
 * The playground when things go wrong, in headless Chromium against `imagegen serve` as a process of
 * its own, so that the server can die under the page as a crash or a restart kills it.
 */

describe.skipIf(!chromiumPath)(`the playground when the server goes away${chromiumPath ? '' : NO_CHROMIUM}`, () => {
  let root: string;
  let server: ServerProcess;
  let browser: Browser;
  let page: Page;
  /** The page's uncaught errors: each is a failure the page did not show its user. */
  const uncaught: string[] = [];

  beforeAll(async () => {
    root = await makeRoot();
    server = await spawnServer({ ...rootEnv(root), PORT: '0' });
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
    expect(await page.isEnabled('#generate')).toBe(true);
    // Sent again while it is down: not reached at all, said so with the same advice.
    await page.click('#generate');
    await expect.poll(() => page.textContent('#form-error'), { timeout: 30_000 }).toMatch(/^The server could not be reached \(.+\): check that the server is running and reachable, then try again\.$/);
  });
});
