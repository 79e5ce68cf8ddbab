import path from 'node:path';
import OpenAI from 'openai';
import type { ImageGenerateParamsNonStreaming, ImageGenerateParamsStreaming, ImageModel, ImagesResponse as SdkImagesResponse } from 'openai/resources/images';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, expectTypeOf, it } from 'vitest';
import { apiError } from './helpers/failures.js';
import { GPT_IMAGE_MODEL_NAMES, gptImageNameTakes, OPENAI_MODEL_NAMES, REQUEST_QUALITIES } from '../src/api/dialects.js';
import type { ImagesResponse } from '../src/api/wire.js';
import { startTestServer, TEST_KEY, writeDemoModel, type TestServer } from './helpers/api-server.js';
import { demoPromptTokens } from './helpers/prompt-tokens.js';

/**
 * Model names as the official SDK sends them: an omitted model is DEFAULT_MODEL, every name the SDK
 * enumerates is an alias, gpt-image names answer as OpenAI's gpt-image models (inline images, their
 * qualities and sizes, echoed settings, usage with the prompt's real token count), dall-e names and
 * installed ids as before.
 */

let server: TestServer;
beforeAll(async () => {
  const aliases = Object.fromEntries(OPENAI_MODEL_NAMES.map((name) => [name, 'wide']));
  server = await startTestServer({ aliases, config: { defaultModel: 'wide' } });
  // The demo model, listing two of the three gpt-image sizes; its tokenizer counts the prompts. Few
  // steps (1 low, 2 standard, 3 hd): these are the largest pictures the API tests make.
  await writeDemoModel(path.join(server.modelsDir, 'wide'), { sizes: ['512x512', '1024x1024', '1536x1024'], default_size: '512x512', steps: { low: 1, standard: 2, hd: 3 } });
  await server.registry.scan();
});
afterAll(() => server.close());

/** Our extension fields and omitted models are outside the SDK's param types; apps still send them. */
const generate = (params: Record<string, unknown>, client = server.client) =>
  client.images.generate({ prompt: 'a red circle', ...params } as unknown as ImageGenerateParamsNonStreaming);


describe('model names', () => {
  it('covers every image model the SDK enumerates', () => {
    expectTypeOf<ImageModel>().toEqualTypeOf<(typeof OPENAI_MODEL_NAMES)[number]>();
  });

  it('types the response so that strict SDK clients accept it', () => {
    expectTypeOf<ImagesResponse>().toExtend<SdkImagesResponse>();
  });

  it('lists each name as a model', async () => {
    const ids = (await server.client.models.list()).data.map((m) => m.id);
    expect(ids).toEqual(expect.arrayContaining([...OPENAI_MODEL_NAMES, 'wide']));
  });

  it('lists under each name the sizes a request may name by it, every one of which generates', async () => {
    const listed = async (id: string) => (await server.client.models.retrieve(id)) as unknown as { sizes: string[]; default_size: string };
    expect(await listed('dall-e-3')).toMatchObject({ sizes: ['512x512', '1024x1024', '1536x1024'], default_size: '512x512' });
    expect(await listed('gpt-image-1')).toMatchObject({ sizes: ['auto', '1024x1024', '1536x1024'], default_size: 'auto' });
    expect(await listed('gpt-image-2')).toMatchObject({ sizes: ['auto', '512x512', '1024x1024', '1536x1024'], default_size: 'auto' });
    // Each draws the size asked ('auto' the model's default_size), a wide one not turned on its side, and
    // counts its image tokens by it: the gpt-image names test below runs at 'auto' alone.
    for (const model of ['gpt-image-1', 'gpt-image-2']) {
      for (const size of (await listed(model)).sizes) {
        const res = await generate({ model, size });
        expect(res.data).toHaveLength(1);
        const meta = await sharp(Buffer.from(res.data![0].b64_json!, 'base64')).metadata();
        const drawn = size === 'auto' ? '512x512' : size;
        expect([res.size, `${meta.width}x${meta.height}`]).toEqual([drawn, drawn]);
        expect(res.usage!.output_tokens).toBe((meta.width! / 16) * (meta.height! / 16));
      }
    }
  });

  it('lists under each name the qualities a request may name by it: each listed one generates, each other is refused', async () => {
    const qualities = async (id: string) => ((await server.client.models.retrieve(id)) as unknown as { qualities: string[] }).qualities;
    expect(await qualities('wide')).toEqual([...REQUEST_QUALITIES]);
    expect(await qualities('dall-e-3')).toEqual([...REQUEST_QUALITIES]);
    expect(await qualities('gpt-image-1')).toEqual(['low', 'medium', 'high', 'auto']);
    expect(await qualities('gpt-image-2.5-flare')).toEqual(['low', 'medium', 'high', 'xhigh', 'max', 'auto']);
    for (const model of ['gpt-image-1', 'gpt-image-2.5-flare']) {
      const listed = await qualities(model);
      for (const quality of REQUEST_QUALITIES) {
        // At size 'auto', 512x512 here: the quality, not the size, is what is checked.
        const asked = generate({ model, quality, size: 'auto' });
        if (listed.includes(quality)) expect((await asked).data).toHaveLength(1);
        else expect(await apiError(asked)).toMatchObject({ status: 400, param: 'quality', code: 'invalid_value' });
      }
    }
  });

  it('runs DEFAULT_MODEL for a request without a model, answering as dall-e-2 (OpenAI\'s default) does', async () => {
    const before = server.engine.batches.length;
    const res = await generate({});
    expect(server.engine.batches.slice(before).map((b) => b.modelDir)).toEqual([path.join(server.modelsDir, 'wide')]);
    expect(Object.keys(res).sort()).toEqual(['created', 'data']);
    expect(Object.keys(res.data![0]).sort()).toEqual(['seed', 'url']);
    // quality 'auto' is every model's default ("the best quality for the given model"), no gpt-image parameter.
    const auto = await generate({ quality: 'auto' });
    expect(Object.keys(auto.data![0]).sort()).toEqual(['seed', 'url']);
  });

  it.each([{ output_format: 'jpeg' }, { background: 'auto' }, { moderation: 'low' }, { quality: 'high' }, { partial_images: 0 }])(
    'answers a request without a model that uses gpt-image parameter %o as a gpt-image model, as OpenAI does',
    async (params) => {
      const res = await generate(params);
      expect(Object.keys(res.data![0]).sort()).toEqual(['b64_json', 'seed']);
      expect(res).toMatchObject({ background: 'opaque', usage: { output_tokens: 1024 } });
    },
  );

  it('checks such a request under DEFAULT_MODEL\'s id: every size and quality it took before still runs', async () => {
    const res = await generate({ output_format: 'jpeg', quality: 'standard', size: '512x512' });
    const meta = await sharp(Buffer.from(res.data![0].b64_json!, 'base64')).metadata();
    expect([meta.format, meta.width]).toEqual(['jpeg', 512]);
  });

  it('names the default model when it is not installed', async () => {
    const bare = await startTestServer({ config: { defaultModel: 'sd-turbo' }, aliases: { 'dall-e-3': 'stub', 'gpt-image-1': 'sd-turbo' } });
    try {
      const err = await apiError(generate({}, bare.client), OpenAI.BadRequestError);
      expect({ status: err.status, type: err.type, param: err.param, code: err.code }).toEqual({
        status: 400,
        type: 'image_generation_user_error',
        param: 'model',
        code: 'invalid_value',
      });
      expect(err.message).toContain("The model 'sd-turbo' (the server's DEFAULT_MODEL, which requests without a model run) does not exist. Available models: 'stub' and 'dall-e-3'.");
      // An OpenAI name aliased to it is told what it names, and which settings chose that.
      const aliased = await apiError(generate({ model: 'gpt-image-1' }, bare.client), OpenAI.BadRequestError);
      expect((aliased.error as { message: string }).message).toBe(
        "The model 'gpt-image-1' is an alias of 'sd-turbo', the server's DEFAULT_MODEL, which is not installed (see MODEL_ALIASES and DEFAULT_MODEL). Available models: 'stub' and 'dall-e-3'.",
      );
    } finally {
      await bare.close();
    }
  });
});

describe('gpt-image names', () => {
  // At size 'auto', 512x512 on this model: a wide size drawn and counted under a gpt-image name is the sizes test's (model names, above).
  it.each(GPT_IMAGE_MODEL_NAMES)('%s answers inline with its settings echoed and usage', async (model) => {
    const prompt = 'a big red circle';
    const res = await server.client.images.generate({ model, prompt, n: 2, size: 'auto', quality: 'high' });
    expect(res.data).toHaveLength(2);
    for (const image of res.data!) {
      expect(Object.keys(image).sort()).toEqual(['b64_json', 'seed']);
      const meta = await sharp(Buffer.from(image.b64_json!, 'base64')).metadata();
      expect([meta.format, meta.width, meta.height]).toEqual(['png', 512, 512]);
    }
    const textTokens = await demoPromptTokens(prompt);
    expect(textTokens).toBeGreaterThan(0);
    // One image token per 16x16 pixels (a 2x2 patch of the 8x VAE's latent pixels), per image.
    const imageTokens = 2 * (512 / 16) * (512 / 16);
    expect(res).toMatchObject({
      background: 'opaque',
      output_format: 'png',
      quality: 'high',
      size: '512x512',
      usage: {
        input_tokens: textTokens,
        input_tokens_details: { text_tokens: textTokens, image_tokens: 0 },
        output_tokens: imageTokens,
        output_tokens_details: { text_tokens: 0, image_tokens: imageTokens },
        total_tokens: textTokens + imageTokens,
      },
    });
  });

  it('counts the whole prompt, past the 77 tokens a CLIP encoder reads', async () => {
    const once = await demoPromptTokens('red square ');
    const res = await server.client.images.generate({ model: 'gpt-image-1', prompt: 'red square '.repeat(100) });
    expect(100 * once).toBeGreaterThan(77);
    expect(res.usage!.input_tokens).toBe(100 * once);
  });

  it('maps low, medium, auto and high to distinct step tiers and echoes them as the SDK names them', async () => {
    const before = server.engine.batches.length;
    const echoed: unknown[] = [];
    for (const quality of ['low', 'medium', 'auto', 'high', undefined] as const) {
      echoed.push((await generate({ model: 'gpt-image-1', quality })).quality);
    }
    expect(echoed).toEqual(['low', 'medium', 'medium', 'high', 'medium']);
    expect(server.engine.batches.slice(before).map((b) => b.steps)).toEqual([1, 2, 2, 3, 2]);
  });

  it('serves auto as the model default, and says the size drawn (openai-node 7 types it as any WxH)', async () => {
    const res = await generate({ model: 'gpt-image-1', size: 'auto', output_format: 'webp', output_compression: 50 });
    const meta = await sharp(Buffer.from(res.data![0].b64_json!, 'base64')).metadata();
    expect([meta.format, meta.width, meta.height]).toEqual(['webp', 512, 512]);
    expect(res).toMatchObject({ output_format: 'webp', background: 'opaque', size: '512x512' });
  });

  it('returns a URL only when asked for one (an extension)', async () => {
    const res = await generate({ model: 'gpt-image-1', response_format: 'url', background: 'auto', moderation: 'low' });
    expect(Object.keys(res.data![0]).sort()).toEqual(['seed', 'url']);
    expect((await fetch(res.data![0].url!)).status).toBe(200);
    expect(res.usage).toBeDefined();
  });

  const cases: Array<[string, Record<string, unknown>, string, string, string]> = [
    ['dall-e quality', { quality: 'hd' }, 'quality', 'invalid_value', "Invalid value: 'hd'. Supported values for model 'gpt-image-1' are: 'low', 'medium', 'high', and 'auto'."],
    ['standard quality', { quality: 'standard' }, 'quality', 'invalid_value', "Supported values for model 'gpt-image-1' are: 'low', 'medium', 'high', and 'auto'."],
    [
      'a gpt-image size the model lacks',
      { size: '1024x1536' },
      'size',
      'invalid_value',
      "Invalid value: '1024x1536'. Supported values for model 'gpt-image-1' are: 'auto', '1024x1024', and '1536x1024' ('auto' is 512x512). " +
        "The installed model 'wide' serves '512x512', '1024x1024', and '1536x1024' when asked for by that name.",
    ],
    ['a model size outside gpt-image sizes', { size: '512x512' }, 'size', 'invalid_value', "Invalid value: '512x512'. Supported values for model 'gpt-image-1' are: 'auto', '1024x1024', and '1536x1024'"],
    ['transparent background', { background: 'transparent' }, 'background', 'unsupported_value', "Unsupported value: 'background' does not support 'transparent'"],
    ['compression of a PNG', { output_compression: 80 }, 'output_compression', 'unsupported_value', "needs output_format 'jpeg' or 'webp'"],
    ['unknown moderation', { moderation: 'strict' }, 'moderation', 'invalid_value', "Invalid value: 'strict'. Supported values are: 'auto' and 'low'."],
    ['streamed urls', { stream: true, response_format: 'url' }, 'response_format', 'unsupported_value', "Unsupported value: 'response_format' 'url' cannot be streamed"],
    ["GPT Image 2.5's quality", { quality: 'xhigh' }, 'quality', 'invalid_value', "Invalid value: 'xhigh'. Supported values for model 'gpt-image-1' are: 'low', 'medium', 'high', and 'auto'."],
    ['GIF output', { output_format: 'gif', frame_count: 4 }, 'output_format', 'invalid_value', "Invalid value: 'gif'. Supported values are: 'png', 'jpeg', and 'webp'."],
    ["GIF frames", { frame_count: 4 }, 'frame_count', 'unsupported_parameter', "Unsupported parameter: 'frame_count' goes with output_format 'gif', and this server makes still pictures only"],
    ["GIF frames' delay", { frame_duration_ms: 100 }, 'frame_duration_ms', 'unsupported_parameter', "Unsupported parameter: 'frame_duration_ms' goes with output_format 'gif'"],
    ['SVG authoring', { svg: { model: 'x' } }, 'svg', 'unsupported_parameter', "Unsupported parameter: 'svg' goes with output_format 'svg', and this server draws pixels only"],
    ['a long safety identifier', { safety_identifier: 'x'.repeat(129) }, 'safety_identifier', 'string_above_max_length', 'Expected a string with maximum length 128'],
  ];

  it.each(cases)('%s -> 400 BadRequestError', async (_, params, param, code, message) => {
    const before = server.engine.batches.length;
    const err = await apiError(generate({ model: 'gpt-image-1', ...params }), OpenAI.BadRequestError);
    expect({ status: err.status, type: err.type, param: err.param, code: err.code }).toEqual({ status: 400, type: 'invalid_request_error', param, code });
    expect((err.error as { message: string }).message).toContain(message);
    expect(server.engine.batches.length).toBe(before);
  });
});

describe('openai-node 7 (GPT Image 2.5 and 2.6)', () => {
  it("takes 2.5's xhigh and max as the most steps (hd), echoing them as asked in the answer and in each streamed image", async () => {
    for (const quality of ['xhigh', 'max'] as const) {
      const before = server.engine.batches.length;
      const res = await server.client.images.generate({ model: 'gpt-image-2.5-flare', prompt: 'a red circle', quality });
      expect(res.quality).toBe(quality);
      expect(server.engine.batches.slice(before).map((b) => b.steps)).toEqual([3]);
      const stream = await server.client.images.generate({ model: 'gpt-image-2.5-sunburst-2026-09-08', prompt: 'a red circle', quality, stream: true, partial_images: 1 });
      const events = [];
      for await (const event of stream) events.push(event);
      expect(events.map((event) => [event.type, event.quality])).toEqual([
        ['image_generation.partial_image', quality],
        ['image_generation.completed', quality],
      ]);
    }
    // auto is answered with the quality it ran as, as OpenAI answers it with the one it picked.
    expect((await server.client.images.generate({ model: 'gpt-image-2.5-flare', prompt: 'a red circle', quality: 'auto' })).quality).toBe('medium');
  });

  it('echoes the effective safety identifier (safety_identifier, else user), and keeps nothing else of it', async () => {
    const params = { model: 'gpt-image-2.6-sunburst', prompt: 'a red circle' } as const;
    expect((await server.client.images.generate({ ...params, safety_identifier: 'hashed-1', user: 'u' })).safety_identifier).toBe('hashed-1');
    expect((await server.client.images.generate({ ...params, safety_identifier: '', user: 'u' })).safety_identifier).toBe('u');
    expect(await server.client.images.generate(params)).not.toHaveProperty('safety_identifier');
    const stream = await server.client.images.generate({ ...params, safety_identifier: 'hashed-2', stream: true });
    const events = [];
    for await (const event of stream) events.push(event);
    expect(events.at(-1)).toMatchObject({ type: 'image_generation.completed', safety_identifier: 'hashed-2' });
  });

  it('accepts complexity, which the diffusion models have no use for', async () => {
    const res = await server.client.images.generate({ model: 'gpt-image-2.5-sunburst', prompt: 'a red circle', complexity: 'high' });
    expect(res.data).toHaveLength(1);
  });
});

describe('gpt-image-2 sizes', () => {
  it('takes a model size beyond the three gpt-image sizes under a gpt-image-2 or 2.5 name only', async () => {
    for (const model of ['gpt-image-2', 'gpt-image-2-2026-04-21', 'gpt-image-2.5-sunburst', 'gpt-image-2.5-flare-2026-09-08']) {
      const res = await generate({ model, size: '512x512' });
      const meta = await sharp(Buffer.from(res.data![0].b64_json!, 'base64')).metadata();
      expect([meta.width, meta.height]).toEqual([512, 512]);
      expect(res.size).toBe('512x512');
    }
    for (const model of ['gpt-image-1.5', 'gpt-image-2.6-flare']) {
      const err = await apiError(generate({ model, size: '512x512' }), OpenAI.BadRequestError);
      expect(err).toMatchObject({ param: 'size', code: 'invalid_value' });
    }
    const err = await apiError(generate({ model: 'gpt-image-2', size: '640x640' }), OpenAI.BadRequestError);
    expect((err.error as { message: string }).message).toContain("Supported values for model 'gpt-image-2' are: 'auto', '512x512', '1024x1024', and '1536x1024'");
  });

  it("says a size outside the three only to clients whose SDK types it as any WxH: openai-python 2.x's strict mode refuses it", async () => {
    // The headers every openai-python request carries (test/openai-python.test.ts runs the real ones).
    const python = (version: string) =>
      new OpenAI({ baseURL: server.baseURL, apiKey: TEST_KEY, maxRetries: 0, defaultHeaders: { 'X-Stainless-Lang': 'python', 'X-Stainless-Package-Version': version } });
    const sizes = async (client: OpenAI, size: string) => {
      const answer = await generate({ model: 'gpt-image-2', size }, client);
      const stream = await client.images.generate({ model: 'gpt-image-2', prompt: 'a red circle', size, stream: true, partial_images: 1 } as ImageGenerateParamsStreaming);
      const events = [];
      for await (const event of stream) events.push(event.size);
      return { answer: answer.size, events };
    };
    // 2.x: left out of the answer (optional there), 'auto' in events (required there, and 'auto' one of its values).
    expect(await sizes(python('2.54.0'), '512x512')).toEqual({ answer: undefined, events: ['auto', 'auto'] });
    expect(await sizes(python('1.109.1'), '512x512')).toEqual({ answer: undefined, events: ['auto', 'auto'] });
    expect(await sizes(python('2.54.0'), '1024x1024')).toEqual({ answer: '1024x1024', events: ['1024x1024', '1024x1024'] });
    for (const client of [python('3.22.1'), server.client]) expect(await sizes(client, '512x512')).toEqual({ answer: '512x512', events: ['512x512', '512x512'] });
  });

  it('follows OpenAI\'s rule for them: sides of multiples of 16, aspect within 1:3 to 3:1, at most 3840x2160', () => {
    const takes = (size: string) => gptImageNameTakes('gpt-image-2', size);
    expect(['1536x864', '512x512', '3840x2160', '2160x3840', '1536x512', '16x48'].filter(takes)).toHaveLength(6);
    expect(['1536x500', '1552x512', '3856x1296', '2176x2176', '4096x2160'].filter(takes)).toEqual([]);
    expect(gptImageNameTakes('gpt-image-1', '1536x864')).toBe(false);
    expect(gptImageNameTakes('gpt-image-1', '1536x1024')).toBe(true);
  });
});

describe('dall-e names and installed ids', () => {
  it.each(['dall-e-2', 'dall-e-3', 'wide'])('%s answers with URLs, no gpt-image fields, standard|hd steps and any model size', async (model) => {
    const before = server.engine.batches.length;
    const res = await generate({ model, quality: 'hd', style: 'natural', size: '512x512' });
    expect(Object.keys(res).sort()).toEqual(['created', 'data']);
    expect(res.data![0].url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/v1\/images\/files\/[0-9a-f]{32}\.png$/);
    expect(server.engine.batches.slice(before).map((b) => [b.steps, b.width])).toEqual([[3, 512]]);
  });

  it("holds dall-e names to OpenAI's prompt limits for them (dall-e-2 1000 characters, dall-e-3 4000), and n to the interface's 1 to 10", async () => {
    const refused: Array<[Record<string, unknown>, string, string, string]> = [
      [{ model: 'dall-e-2', prompt: 'a'.repeat(1001) }, 'prompt', 'string_above_max_length', "Invalid 'prompt': string too long. Expected a string with maximum length 1000, but got a string with length 1001 instead."],
      [{ model: 'dall-e-3', prompt: 'a'.repeat(4001) }, 'prompt', 'string_above_max_length', "Invalid 'prompt': string too long. Expected a string with maximum length 4000, but got a string with length 4001 instead."],
      [{ model: 'dall-e-3', n: 11 }, 'n', 'integer_above_max_value', "Invalid 'n': integer above maximum value. Expected a value <= 10, but got 11 instead."],
    ];
    const before = server.engine.batches.length;
    for (const [params, param, code, message] of refused) {
      const err = await apiError(generate(params), OpenAI.BadRequestError);
      expect({ param: err.param, code: err.code, message: (err.error as { message: string }).message }).toEqual({ param, code, message });
    }
    expect(server.engine.batches.length).toBe(before);
    // At the limits they run; an installed id, a gpt-image name and a request without a model keep the server's own.
    const accepted: Record<string, unknown>[] = [
      { model: 'dall-e-2', prompt: 'a'.repeat(1000), n: 10 },
      { model: 'dall-e-3', prompt: 'a'.repeat(4000), n: 10 },
      { model: 'wide', prompt: 'a'.repeat(4001), n: 2 },
      { model: 'gpt-image-1', prompt: 'a'.repeat(4001), n: 2 },
      { prompt: 'a'.repeat(4001), n: 2 },
    ];
    for (const params of accepted) expect((await generate({ response_format: 'b64_json', ...params })).data).toHaveLength((params.n as number | undefined) ?? 1);
  });

  it('counts characters as OpenAI does, an emoji (two UTF-16 units in JavaScript) as one, in a prompt and a safety identifier', async () => {
    const emoji = (count: number) => '🎨'.repeat(count);
    // dall-e-2's 1000 characters, and openai-node 7's 128 for safety_identifier, met in emoji: taken.
    const taken = await generate({ model: 'dall-e-2', prompt: emoji(1000), response_format: 'b64_json' });
    expect(taken.data).toHaveLength(1);
    expect(server.engine.batches.at(-1)!.items[0].prompt).toBe(emoji(1000));
    expect((await generate({ model: 'gpt-image-1', safety_identifier: emoji(128) })).safety_identifier).toBe(emoji(128));
    // One more is refused, the length said in characters.
    const refused: Array<[Record<string, unknown>, string, string]> = [
      [{ model: 'dall-e-2', prompt: emoji(1001) }, 'prompt', "Invalid 'prompt': string too long. Expected a string with maximum length 1000, but got a string with length 1001 instead."],
      [{ model: 'gpt-image-1', safety_identifier: emoji(129) }, 'safety_identifier', "Invalid 'safety_identifier': string too long. Expected a string with maximum length 128, but got a string with length 129 instead."],
    ];
    for (const [params, param, message] of refused) {
      const err = await apiError(generate(params), OpenAI.BadRequestError);
      expect({ param: err.param, code: err.code, message: (err.error as { message: string }).message }).toEqual({ param, code: 'string_above_max_length', message });
    }
  });

  it("keeps the server's prompt limit for a request without a model, even where DEFAULT_MODEL is a dall-e name", async () => {
    const dallEDefault = await startTestServer({ aliases: { 'dall-e-2': 'stub' }, config: { defaultModel: 'dall-e-2' } });
    try {
      const long = 'a'.repeat(1001);
      expect((await generate({ prompt: long, response_format: 'b64_json' }, dallEDefault.client)).data).toHaveLength(1);
      expect(dallEDefault.engine.batches.at(-1)!.items[0].prompt).toBe(long);
      // Named, the same prompt is held to dall-e-2's limit.
      const err = await apiError(generate({ model: 'dall-e-2', prompt: long }, dallEDefault.client), OpenAI.BadRequestError);
      expect(err.code).toBe('string_above_max_length');
    } finally {
      await dallEDefault.close();
    }
  });

  it('names only the model sizes in a size error', async () => {
    const err = await apiError(generate({ model: 'dall-e-3', size: '1024x1792' }), OpenAI.BadRequestError);
    expect({ param: err.param, code: err.code }).toEqual({ param: 'size', code: 'invalid_value' });
    expect((err.error as { message: string }).message).toBe(
      "Invalid value: '1024x1792'. Supported values are: '512x512', '1024x1024', and '1536x1024'. The server serves another size (both sides multiples of 64) once it is in 'sizes' in the model's imagegen.json.",
    );
  });
});
