import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ModelEntry } from '../src/models/registry.js';
import { PromptTokenCounter } from '../src/service/prompt-tokens.js';
import { DEMO_TOKENIZER, demoPromptTokens } from './helpers/prompt-tokens.js';

/** The prompt token counts of gpt-image usage: the model's own tokenizer, loaded once per folder version. */

let root: string;
beforeAll(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-prompt-tokens-'));
  await cp(DEMO_TOKENIZER, path.join(root, 'tokenizer'), { recursive: true });
});
afterAll(() => rm(root, { recursive: true, force: true }));

/** The counter reads only the folder, its tokenizer and its version. */
const model = (version: string) => ({ version, layout: { dir: root, tokenizer: path.join(root, 'tokenizer') } }) as ModelEntry;

describe('PromptTokenCounter', () => {
  it('counts what the encoder row holds for a short prompt, and all of a long one', async () => {
    const counter = new PromptTokenCounter();
    for (const prompt of ['a big red circle', 'Ünïcödé ✓ & <html>', '']) {
      expect(await counter.count(model('1'), prompt)).toBe(await demoPromptTokens(prompt));
    }
    const once = await demoPromptTokens('a blue square, ');
    expect(await counter.count(model('1'), 'a blue square, '.repeat(200))).toBe(200 * once);
  });

  it('keeps a folder tokenizer until the folder changes version', async () => {
    const counter = new PromptTokenCounter();
    const before = await counter.count(model('1'), 'red');
    // Without merges every letter is a token of its own.
    const file = path.join(root, 'tokenizer', 'tokenizer.json');
    const json = JSON.parse(await readFile(file, 'utf8'));
    await writeFile(file, JSON.stringify({ ...json, model: { ...json.model, merges: [] } }));
    expect(await counter.count(model('1'), 'red')).toBe(before);
    expect(await counter.count(model('2'), 'red')).toBe(3);
    expect(before).toBe(1);
  });
});
