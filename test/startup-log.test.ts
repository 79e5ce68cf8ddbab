import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it, vi } from 'vitest';
import { capturedLogs } from './helpers/logs.js';
import { startRealServer } from './helpers/real-server.js';
import { killServer, spawnServer } from './helpers/server-process.js';
import { TEST_SETTINGS } from './helpers/test-settings.js';

/**
 * What the server's log says as it starts is what then happens: an operator reads it to learn what
 * their settings did. Each test starts the whole service (worker processes included) and checks a
 * start-up line against what the server then does.
 */

describe('a DEFAULT_MODEL that is not installed', () => {
  it('is said to fail the requests that name no model and the aliases that name it, not the aliases MODEL_ALIASES points elsewhere, which work', async () => {
    const logs = capturedLogs<{ msg: string }>();
    const real = await startRealServer({ env: { DEFAULT_MODEL: 'absent', MODEL_ALIASES: 'dall-e-3=demo-shapes,mine=demo-shapes', PRELOAD: 'none' }, logger: logs.logger });
    try {
      const warning = logs.lines.map((line) => line.msg).find((msg) => msg.startsWith("default model 'absent'"));
      expect(warning).toMatch(/^default model 'absent' is not installed: requests that name no model, and those for dall-e-2, gpt-image-1, .*, will fail until it can be used$/);
      expect(warning).not.toMatch(/dall-e-3|mine/);
      // What the line left out works.
      const image = await real.client.images.generate({ model: 'dall-e-3', prompt: 'a red circle', size: '1024x1024', response_format: 'b64_json' });
      expect(image.data?.[0]?.b64_json).toBeTruthy();
    } finally {
      await real.close();
    }
  });
});

describe('a DEFAULT_MODEL that is not installed, and no MODELS_DIR', () => {
  it('is said to be searched for only among the models that come with imagegen: installed into a folder with --models-dir, it is not there', async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-no-models-dir-'));
    const server = await spawnServer({ PORT: '0', DATA_DIR: dataDir, DEFAULT_MODEL: 'sd-turbo' });
    try {
      const messages = server.log.map((line) => (JSON.parse(line) as { msg: string }).msg);
      const why = "is not installed (MODELS_DIR is not set, so only the models that come with imagegen are searched)";
      expect(messages).toContainEqual(expect.stringMatching(new RegExp(`^default model 'sd-turbo' ${why.replace(/[()]/g, '\\$&')}: requests that name no model`)));
      expect(messages).toContain(`PRELOAD names 'sd-turbo', which ${why}: not preloading it`);
    } finally {
      await killServer(server);
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});

describe('WORKER_THREADS without WORKERS', () => {
  it("is what the line on the default worker count says the worker's threads are, not every core", async () => {
    const logs = capturedLogs<{ msg: string }>();
    const real = await startRealServer({ env: { WORKER_THREADS: '1', PRELOAD: 'none' }, logger: logs.logger });
    try {
      const line = logs.lines.map((entry) => entry.msg).find((msg) => msg.startsWith('WORKERS not set'));
      expect(line).toBe('WORKERS not set: 1 worker process, one on the CPU (with the 1 thread WORKER_THREADS gives it)');
    } finally {
      await real.close();
    }
  });
});

describe('the settings given', () => {
  it('are said in one line as the server starts, by flag or by variable, the keys left out', async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-settings-'));
    const key = 'sk-startup-log-0123456789';
    const server = await spawnServer({ PORT: '0', DATA_DIR: dataDir, API_KEYS: key, QUEUE_MAX: '7' }, { args: ['--image-ttl-seconds', '600'] });
    try {
      const settings = () => server.log.map((line) => JSON.parse(line) as { msg: string; settings?: Record<string, string> }).find((line) => line.msg.startsWith('settings given'))?.settings;
      // spawnServer gives WORKERS=1 and TEST_SETTINGS too.
      await expect.poll(settings).toEqual({ PORT: '0', DATA_DIR: dataDir, API_KEYS: '[redacted]', QUEUE_MAX: '7', IMAGE_TTL_SECONDS: '600', WORKERS: '1', ...TEST_SETTINGS });
      expect(server.log.join('\n')).not.toContain(key);
    } finally {
      await killServer(server);
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});

describe('the image store', () => {
  it('is named with the images it kept from before the start: a restart that opened another folder (DATA_DIR relative to another working directory) says it has none, and the URLs given before are 404 there', async () => {
    const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-store-log-'));
    const start = async (env: Record<string, string> = {}) => {
      const logs = capturedLogs<{ msg: string; images?: number }>();
      const real = await startRealServer({ root, env: { PRELOAD: 'none', ...env }, logger: logs.logger });
      return { real, line: () => logs.lines.find((line) => line.msg.startsWith('image store: ')) };
    };
    try {
      const first = await start();
      expect(first.line()?.msg).toBe(`image store: ${path.join(root, 'data', 'images')}: no unexpired images from before the start`);
      const { data } = await first.real.client.images.generate({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256' as '1024x1024', response_format: 'url' });
      const url = data![0].url!;
      await first.real.close();

      const again = await start();
      expect(again.line()).toMatchObject({ images: 1, msg: expect.stringMatching(new RegExp(`^image store: ${path.join(root, 'data', 'images')}: 1 unexpired image \\([\\d.]+ KiB of MAX_STORE_BYTES, 2\\.0 GiB\\) from before the start, served until they expire$`)) });
      expect((await fetch(url.replace(/^http:\/\/[^/]+/, again.real.baseURL.replace(/\/v1$/, '')))).status).toBe(200);
      await again.real.close();

      // The default DATA_DIR, ./data, of a server started from another folder than before.
      const elsewhere = await start({ DATA_DIR: path.join(root, 'other') });
      expect(elsewhere.line()?.msg).toBe(`image store: ${path.join(root, 'other', 'images')}: no unexpired images from before the start`);
      expect((await fetch(url.replace(/^http:\/\/[^/]+/, elsewhere.real.baseURL.replace(/\/v1$/, '')))).status).toBe(404);
      await elsewhere.real.close();
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });

  it('says, of a bucket that cannot be read as the server starts, that it may hold more than it counted', async () => {
    const logs = capturedLogs<{ msg: string }>();
    // Nothing listens on port 1: every request to the bucket is refused.
    const env = { PRELOAD: 'none', STORE: 's3', S3_BUCKET: 'absent', S3_ENDPOINT: 'http://127.0.0.1:1', S3_REGION: 'us-east-1', S3_FORCE_PATH_STYLE: 'true' };
    vi.stubEnv('AWS_ACCESS_KEY_ID', 'test');
    vi.stubEnv('AWS_SECRET_ACCESS_KEY', 'test');
    try {
      const real = await startRealServer({ env, logger: logs.logger });
      await real.close();
    } finally {
      vi.unstubAllEnvs();
    }
    expect(logs.lines.map((line) => line.msg)).toContain(
      "image store: the S3 bucket 'absent' under 'images/': no unexpired images from before the start; it cannot be used now (see the error above), and may hold more than it counted",
    );
  });
});
