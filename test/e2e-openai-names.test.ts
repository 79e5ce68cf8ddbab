import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readImageFile } from './helpers/picture.js';
import { demoPromptTokens } from './helpers/prompt-tokens.js';
import { startRealServer, type RealServer } from './helpers/real-server.js';

/**
 * A fresh install as `imagegen serve` runs it (real workers, the embedded demo model, no settings but
 * the key): the OpenAI SDK with no model, and with a gpt-image name, gets the demo model's pictures.
 */

const KEY = 'sk-e2e-names-0123456789';
let real: RealServer;
let client: OpenAI;

beforeAll(async () => {
  real = await startRealServer({ apiKey: KEY });
  client = real.client;
});

afterAll(() => real?.close());

describe('OpenAI model names with the real engine', () => {
  it('draws with DEFAULT_MODEL (the demo model) when the request names no model', async () => {
    const params = { prompt: 'a yellow circle' } as OpenAI.ImageGenerateParamsNonStreaming;
    const { data } = await client.images.generate(params);
    const file = await fetch(data![0].url!);
    const { info, reading } = await readImageFile(Buffer.from(await file.arrayBuffer()));
    expect([info.width, info.height, reading.colour]).toEqual([512, 512, 'yellow']);
  });

  it('answers a gpt-image name inline, with the settings used and the prompt counted by the model tokenizer', async () => {
    const prompt = 'a big red circle';
    const res = await client.images.generate({ model: 'gpt-image-1.5', prompt, size: '1024x1024', quality: 'medium' });
    const { info, reading } = await readImageFile(Buffer.from(res.data![0].b64_json!, 'base64'));
    expect([info.width, info.height, reading.colour]).toEqual([1024, 1024, 'red']);
    const textTokens = await demoPromptTokens(prompt);
    expect(res).toMatchObject({
      background: 'opaque',
      output_format: 'png',
      quality: 'medium',
      size: '1024x1024',
      usage: { input_tokens: textTokens, output_tokens: 4096, total_tokens: textTokens + 4096 },
    });
  });
});
