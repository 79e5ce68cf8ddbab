import OpenAI, { toFile } from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ErrorBody, ImageStreamEvent } from '../src/api/wire.js';
import type { RunningServer } from '../src/server.js';
import { capturedLogs } from './helpers/logs.js';
import { holdBusyWorker, holdNextBatch } from './helpers/busy-worker.js';
import { readImageFile } from './helpers/picture.js';
import { startRealServer, type RealServer } from './helpers/real-server.js';

/**
 * Streamed generations and edits (`stream: true`) on a real server with real workers and the embedded
 * demo model, read with the official openai-node client: its `for await` loop gets OpenAI's events,
 * the previews show the picture the prompt asks for (the reference model's prediction of the clean
 * picture is exact), and the streamed images are the very ones a plain request gets.
 */

const KEY = 'sk-streaming-0123456789';
let real: RealServer;
let server: RunningServer;
let client: OpenAI;

const logs = capturedLogs<{ msg: string }>();

beforeAll(async () => {
  real = await startRealServer({ apiKey: KEY, env: { WORKERS: '1' }, logger: logs.logger });
  ({ server, client } = real);
});

afterAll(() => real?.close());

/** A counter of the demo model's, as /metrics says it. */
async function demoMetric(name: string): Promise<number> {
  const metrics = await (await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })).text();
  return Number(new RegExp(`^${name}\\{model="demo-shapes"\\} (\\d+)$`, 'm').exec(metrics)?.[1] ?? 0);
}

/** The settings of the requests leaveMergedBatch merges. */
const MERGED = { model: 'demo-shapes', prompt: 'a red circle', size: '512x512', steps: 40 };

/**
 * Two streamed requests of MERGED's settings (and `fields`) merged into one batch, as a long batch held
 * the worker while they waited; the client of the first, of two images, leaves as the merged batch's
 * first step is heard (before any preview), with the worker held until the server heard it leave.
 * Answers the events of the request that stays, and the partial images both heard.
 */
async function leaveMergedBatch(fields: object): Promise<{ events: ImageStreamEvent[]; partials: ImageStreamEvent[] }> {
  const aborted = 'request aborted: the client closed the connection before the answer was sent';
  const logged = logs.lines.length;
  const abortsLogged = () => logs.lines.slice(logged).filter((line) => line.msg === aborted).length;
  await expect.poll(() => server.engine.readiness().ready, { timeout: 60_000 }).toBe(true);
  const holder = new AbortController();
  const holding = rawEvents({ model: 'demo-shapes', prompt: 'a red circle', size: '1024x1024', steps: 150, stream: true }, holder.signal).catch(() => undefined);
  await expect.poll(() => server.engine.load().running).toBe(1);
  let resume = await holdBusyWorker(server.engine);
  const partials: ImageStreamEvent[] = [];
  const heard = (event: ImageStreamEvent) => void (event.type === 'image_generation.partial_image' && partials.push(event));
  const body = { ...MERGED, ...fields, stream: true };
  const leaving = new AbortController();
  let merged: Promise<() => void> | undefined;
  const left = rawEvents({ ...body, n: 2 }, leaving.signal, heard).catch(() => undefined);
  const stays = rawEvents({ ...body, stream_progress: true }, undefined, (event) => {
    heard(event);
    if (event.type === 'imagegen.progress' && event.step !== undefined) merged ??= holdBusyWorker(server.engine);
  });
  try {
    await expect.poll(() => server.engine.load()).toEqual({ running: 1, queued: 1 });
    holder.abort();
    resume();
    await expect.poll(() => merged, { timeout: 30_000 }).toBeDefined();
    resume = await merged!;
    leaving.abort();
    await expect.poll(abortsLogged).toBe(2);
  } finally {
    resume();
  }
  const { events } = await stays;
  await Promise.all([left, holding]);
  return { events, partials };
}

const picture = (b64: string) => readImageFile(Buffer.from(b64, 'base64'));

/** A flat red 256x256 PNG: the picture the streamed edits start from. */
const redPicture = () => sharp({ create: { width: 256, height: 256, channels: 3, background: '#ff0000' } }).png().toBuffer();

/** The events of a raw streamed request (for our extension events, which the SDK types do not name). */
async function rawEvents(body: object, signal?: AbortSignal, onEvent?: (event: ImageStreamEvent) => void): Promise<{ status: number; events: ImageStreamEvent[]; names: string[] }> {
  const res = await fetch(`${server.url}/v1/images/generations`, {
    method: 'POST',
    headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal,
  });
  const events: ImageStreamEvent[] = [];
  const names: string[] = [];
  if (!res.headers.get('content-type')?.startsWith('text/event-stream')) return { status: res.status, events: [await res.json()], names };
  const decoder = new TextDecoder();
  let buffered = '';
  for await (const chunk of res.body!) {
    buffered += decoder.decode(chunk, { stream: true });
    let end: number;
    while ((end = buffered.indexOf('\n\n')) >= 0) {
      const frame = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      // Comments (the stream's opening and keep-alive lines) carry no event.
      if (frame.startsWith(':')) continue;
      const name = /^event: (.*)$/m.exec(frame)?.[1];
      const event = JSON.parse(/^data: (.*)$/m.exec(frame)![1]) as ImageStreamEvent;
      if (name) names.push(name);
      events.push(event);
      onEvent?.(event);
    }
  }
  return { status: res.status, events, names };
}

describe('streamed generations', () => {
  it("sends OpenAI's partial and completed events to openai-node's for-await loop, the previews already showing the prompt", async () => {
    const stream = await client.images.generate({ model: 'gpt-image-1', prompt: 'a blue square', size: '1024x1024', stream: true, partial_images: 2 });
    const events: OpenAI.ImageGenStreamEvent[] = [];
    for await (const event of stream) events.push(event);

    expect(events.map((e) => e.type)).toEqual(['image_generation.partial_image', 'image_generation.partial_image', 'image_generation.completed']);
    const [first, second, completed] = events;
    expect([first, second].map((e) => (e as OpenAI.ImageGenPartialImageEvent).partial_image_index)).toEqual([0, 1]);
    for (const event of events) {
      expect(event).toMatchObject({ size: '1024x1024', quality: 'medium', background: 'opaque', output_format: 'png' });
      expect(event.created_at).toBeGreaterThan(1.7e9);
      const { format, width, height } = await sharp(Buffer.from(event.b64_json, 'base64')).metadata();
      expect([format, width, height]).toEqual(['png', 1024, 1024]);
    }
    // Early previews are the model's best guess at high noise (a blend of the pictures it could still
    // become); by the last one before the end, the guess is the picture asked for.
    for (const event of [second, completed]) {
      const { reading } = await picture(event.b64_json);
      expect([reading.colour, reading.shape]).toEqual(['blue', 'square']);
    }
    expect((completed as OpenAI.ImageGenCompletedEvent).usage).toMatchObject({ output_tokens: 4096, input_tokens_details: { image_tokens: 0 } });
  });

  it('tells proxies to pass the events on as they come: not cached, not transformed (compressed, buffered), not buffered by nginx', async () => {
    const res = await fetch(`${server.url}/v1/images/generations`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'a blue square', size: '256x256', stream: true }),
    });
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(res.headers.get('cache-control')).toBe('no-cache, no-transform');
    expect(res.headers.get('x-accel-buffering')).toBe('no');
    expect(await res.text()).toContain('event: image_generation.completed');
  });

  it('streams, for every image of n, its previews and then the image a plain request gets for the same seed', async () => {
    const params = { model: 'demo-shapes', prompt: 'a green triangle', n: 2, size: '256x256', seed: 7, output_format: 'webp', output_compression: 80 } as const;
    const plain = await client.images.generate({ ...params, response_format: 'b64_json' });
    const stream = await client.images.generate({ ...params, stream: true, partial_images: 1 });
    const events: OpenAI.ImageGenStreamEvent[] = [];
    for await (const event of stream) events.push(event);

    const partials = events.filter((e) => e.type === 'image_generation.partial_image');
    const completed = events.filter((e) => e.type === 'image_generation.completed');
    expect(partials).toHaveLength(2);
    expect(completed.map((e) => e.b64_json)).toEqual(plain.data!.map((d) => d.b64_json));
    expect(completed.map((e) => (e as unknown as { seed: number }).seed)).toEqual([7, 8]);
    for (const event of partials) expect((await sharp(Buffer.from(event.b64_json, 'base64')).metadata()).format).toBe('webp');
    // The size drawn, any WxH (openai-node 7 types it as a string).
    expect([...partials, ...completed].map((e) => e.size)).toEqual(['256x256', '256x256', '256x256', '256x256']);
  });

  it('echoes a `user` of any text whole in the completed event, however the event is cut into pieces for the socket', async () => {
    // An emoji is two UTF-16 characters. A piece ended between them where a piece boundary fell, and each
    // half went out as U+FFFD. The boundaries fall every 64 Ki characters, at an even or odd offset into
    // the text depending on the image's base64 length: one run of emoji each side of a one-character shift
    // puts a boundary inside a pair in one of the two, whatever that length.
    const user = `${'😀'.repeat(40_000)}a${'😀'.repeat(40_000)}`;
    const stream = await client.images.generate({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256', stream: true, user });
    const completed: OpenAI.ImageGenCompletedEvent[] = [];
    for await (const event of stream) if (event.type === 'image_generation.completed') completed.push(event);
    expect(completed).toHaveLength(1);
    expect(completed[0].safety_identifier === user).toBe(true);
  });

  it('counts the previews it sent in /metrics', async () => {
    const before = await demoMetric('imagegen_partial_images_total');
    await rawEvents({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256', n: 2, steps: 4, stream: true, partial_images: 2 });
    expect((await demoMetric('imagegen_partial_images_total')) - before).toBe(4);
  });

  it("counts in /metrics the previews sent, none of a client's that left the merged batch it shared", async () => {
    const before = await demoMetric('imagegen_partial_images_total');
    const { events, partials } = await leaveMergedBatch({ partial_images: 3 });
    expect(events.filter((e) => e.type === 'image_generation.partial_image')).toHaveLength(3);
    // Before, the previews made for the client that left counted too: 9.
    expect((await demoMetric('imagegen_partial_images_total')) - before).toBe(partials.length);
  });

  it('makes no image for a client that left the merged batch it shared; the client that stays gets the image it gets alone', async () => {
    const before = await demoMetric('imagegen_images_generated_total');
    const { events } = await leaveMergedBatch({ seed: 11 });
    const completed = events.filter((e) => e.type === 'image_generation.completed');
    expect(completed).toHaveLength(1);
    // The held batch, stopped, made none; before, the two images of the client that left were made (and encoded) too: 3.
    expect((await demoMetric('imagegen_images_generated_total')) - before).toBe(1);
    const alone = await client.images.generate({ ...MERGED, seed: 11, response_format: 'b64_json' } as OpenAI.ImageGenerateParamsNonStreaming);
    expect(completed.map((e) => 'b64_json' in e && e.b64_json)).toEqual([alone.data![0].b64_json]);
  });

  it('sends fewer previews than asked when the loop has fewer steps to show them after', async () => {
    const { events } = await rawEvents({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256', steps: 2, stream: true, partial_images: 3 });
    expect(events.map((e) => e.type)).toEqual(['image_generation.partial_image', 'image_generation.completed']);
  });

  it('adds imagegen.progress events with stream_progress: the queue while waiting, then the steps', async () => {
    const { events, names } = await rawEvents({ model: 'demo-shapes', prompt: 'a red circle', size: '1024x1024', steps: 12, stream: true, stream_progress: true });
    expect(names).toEqual(events.map((e) => e.type));
    const progress = events.filter((e) => e.type === 'imagegen.progress');
    expect(progress[0]).toEqual({ type: 'imagegen.progress', queued_ahead: 0 });
    // Steps come at most every 50 ms (the last always): rising, each out of 12, ending at 12.
    const steps = progress.filter((e) => e.step !== undefined);
    expect(steps.every((e) => e.steps === 12)).toBe(true);
    expect(steps.map((e) => e.step)).toEqual([...new Set(steps.map((e) => e.step!))].sort((a, b) => a! - b!));
    expect(steps.at(-1)!.step).toBe(12);
    expect(events.at(-1)!.type).toBe('image_generation.completed');
  });

  it('stops counting a request as waiting once a worker took its batch, before its first step: the requests queued behind it are not ahead of it', async () => {
    const body = { model: 'demo-shapes', prompt: 'a red circle', size: '256x256', stream: true, stream_progress: true };
    const queuedAhead = (events: ImageStreamEvent[]) => events.flatMap((e) => (e.type === 'imagegen.progress' && e.queued_ahead !== undefined ? [e.queued_ahead] : []));
    await expect.poll(() => server.engine.readiness().ready, { timeout: 60_000 }).toBe(true);
    // Its batch held before the worker begins it, as a model's load (seconds to a minute) holds it before the first step.
    const { sent: taken, resume } = await holdNextBatch(server.engine, () => rawEvents({ ...body, steps: 3 }));
    let behind: Promise<unknown>[] = [];
    try {
      // Two requests queue behind it (steps told apart: they do not merge into one batch).
      const last: ImageStreamEvent[] = [];
      behind = [rawEvents({ ...body, steps: 4 }), rawEvents({ ...body, steps: 5 }, undefined, (event) => last.push(event))];
      // Told every second while it waits: by its third, the taken request's own second has gone too, with both queued.
      await expect.poll(() => queuedAhead(last).length, { timeout: 10_000 }).toBeGreaterThanOrEqual(3);
    } finally {
      resume();
    }
    const { events } = await taken;
    // Told once, as it was taken at once; before, it was then told of the two behind it as one ahead of it.
    expect(queuedAhead(events)).toEqual([0]);
    expect(events.at(-1)!.type).toBe('image_generation.completed');
    await Promise.all(behind);
  });

  it("says from the first step the denoiser passes of all the request's batches, PNDM's repeated one included", async () => {
    // Six images run as two batches (the model takes four at a time). PNDM makes one pass more than the
    // steps asked: 4 steps are 5 passes a batch, and an edit at strength 0.5 of 10 steps runs 6 (the last
    // 5 steps, the repeated pass with them). A batch yet to begin counted as its steps alone, and the
    // total grew as it began ("step 5 of 9", then "step 6 of 10").
    const totals = (events: ImageStreamEvent[]) => [...new Set(events.flatMap((e) => (e.type === 'imagegen.progress' && e.steps !== undefined ? [e.steps] : [])))];
    const { events } = await rawEvents({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256', n: 6, steps: 4, scheduler: 'pndm', stream: true, stream_progress: true });
    expect(totals(events)).toEqual([10]);

    const red = await redPicture();
    const edit = await client.images.edit({
      model: 'demo-shapes',
      image: await toFile(red, 'red.png'),
      prompt: 'a blue square',
      size: '256x256',
      n: 6,
      stream: true,
      // @ts-expect-error our extensions
      stream_progress: true,
      steps: 10,
      strength: 0.5,
      scheduler: 'pndm',
    });
    const edited: ImageStreamEvent[] = [];
    for await (const event of edit) edited.push(event as ImageStreamEvent);
    expect(totals(edited)).toEqual([12]);
  });
});

describe('streamed edits', () => {
  it('sends image_edit events for a multipart edit made with toFile', async () => {
    const red = await redPicture();
    const stream = await client.images.edit({
      model: 'demo-shapes',
      image: await toFile(red, 'red.png'),
      prompt: 'a blue square',
      size: '256x256',
      stream: true,
      partial_images: 1,
      // @ts-expect-error strength is our extension
      strength: 1,
      steps: 4,
    });
    const events: OpenAI.ImageEditStreamEvent[] = [];
    for await (const event of stream) events.push(event);
    expect(events.map((e) => e.type)).toEqual(['image_edit.partial_image', 'image_edit.completed']);
    const { reading } = await picture(events[1].b64_json);
    expect([reading.colour, reading.shape]).toEqual(['blue', 'square']);
    expect((events[1] as OpenAI.ImageEditCompletedEvent).usage.input_tokens_details.image_tokens).toBeGreaterThan(0);
  });
});

describe('streaming errors and cancellation', () => {
  it('refuses a stream it cannot send before streaming, with a plain JSON error', async () => {
    const cases: [object, string, string][] = [
      [{ response_format: 'url', stream: true }, 'response_format', 'unsupported_value'],
      [{ stream_progress: true }, 'stream_progress', 'unsupported_value'],
      [{ stream: true, partial_images: 4 }, 'partial_images', 'integer_above_max_value'],
      [{ stream: true, size: '100x100' }, 'size', 'invalid_value'],
    ];
    for (const [fields, param, code] of cases) {
      const { status, events } = await rawEvents({ model: 'demo-shapes', prompt: 'a red circle', ...fields });
      expect([status, (events[0] as unknown as ErrorBody).error]).toMatchObject([400, { param, code }]);
    }
  });

  it('ends the stream with an error event that openai-node raises when the worker dies mid-stream, and counts it under its status', async () => {
    const requestsCounted = async (status: string) => {
      const metrics = await (await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })).text();
      return Number(new RegExp(`^imagegen_http_requests_total\\{method="POST",route="/v1/images/generations",status="${status}"\\} (\\d+)$`, 'm').exec(metrics)?.[1] ?? 0);
    };
    const failedBefore = await requestsCounted('500');
    // One preview, after step 75 of 150: the worker is killed as it reaches the client, and the next
    // event, the image, is 75 steps, a decode and a PNG encode away (1.4 s unheld on a 2-core machine).
    // With three, the second preview came 38 steps later (0.4 s at 1024x1024): a first preview slow
    // through the pipe, the SSE and the SDK on a loaded machine let it in before the kill.
    const stream = await client.images.generate({ model: 'demo-shapes', prompt: 'a red circle', size: '1792x1024', stream: true, partial_images: 1, steps: 150 } as OpenAI.ImageGenerateParamsStreaming);
    const seen: string[] = [];
    const reading = (async () => {
      for await (const event of stream) {
        seen.push(event.type);
        // The preview came: the batch runs; its worker dies.
        if (seen.length === 1) process.kill(server.engine.workers().find((w) => w.busy)!.pid!, 'SIGKILL');
      }
    })();
    await expect(reading).rejects.toMatchObject({ status: undefined, error: { code: 'worker_crashed' } });
    expect(seen).toEqual(['image_generation.partial_image']);
    // Counted as the failure it was, not as the 200 that began the stream.
    await expect.poll(() => requestsCounted('500')).toBe(failedBefore + 1);
    await expect.poll(() => server.engine.readiness().ready, { timeout: 60_000 }).toBe(true);
  });

  it("sends each image as its batch finishes: a later batch's failure keeps those already made", async () => {
    // Six images run as batches of four and two (the model's max_batch) on the one worker, one after the other.
    const stream = await client.images.generate({ model: 'demo-shapes', prompt: 'a red circle', n: 6, seed: 40, size: '512x512', steps: 150, stream: true } as OpenAI.ImageGenerateParamsStreaming);
    const seeds: number[] = [];
    // The worker dies once it took the second batch and denoises it (killed before it took it, the
    // batch would go to its replacement and succeed).
    const killDuringSecondBatch = async () => {
      await expect.poll(() => server.engine.workers()[0], { timeout: 30_000, interval: 5 }).toMatchObject({ busy: true, step: expect.toSatisfy((step: number) => step > 0 && step < 150) });
      process.kill(server.engine.workers()[0].pid!, 'SIGKILL');
    };
    let killing: Promise<void> | undefined;
    const reading = (async () => {
      for await (const event of stream) {
        seeds.push((event as unknown as { seed: number }).seed);
        // The first batch's images came: the second batch is next.
        if (seeds.length === 1) killing = killDuringSecondBatch();
      }
    })();
    await expect(reading).rejects.toMatchObject({ error: { code: 'worker_crashed' } });
    await killing;
    expect(seeds).toEqual([40, 41, 42, 43]);
    await expect.poll(() => server.engine.readiness().ready, { timeout: 60_000 }).toBe(true);
  });

  it('stops the work when the client disconnects mid-stream', async () => {
    const leave = new AbortController();
    // The client leaves at the first step it hears of (a worker sends its first step at once, the next 50 ms
    // later: dozens of steps on, or the last one, on a machine fast enough), its worker held until the server
    // has heard it leave: the news then costs no steps, however fast the machine or late the news.
    let held: Promise<() => void> | undefined;
    const streamed = rawEvents({ model: 'demo-shapes', prompt: 'a red circle', size: '1024x1024', steps: 150, stream: true, stream_progress: true }, leave.signal, (event) => {
      if (event.type !== 'imagegen.progress' || event.step === undefined || held) return;
      held = holdBusyWorker(server.engine).then((resume) => (leave.abort(), resume));
    });
    const logged = logs.lines.length;
    const messages = () => logs.lines.slice(logged).map((line) => line.msg);
    try {
      await expect(streamed).rejects.toThrow();
      // A client leaving is no failed stream: the log says it left, and so the worker was told to stop.
      await expect.poll(messages).toContain('request aborted: the client closed the connection before the answer was sent');
      (await held!)();
      // The worker stops at its next step: the server is idle long before 150 steps at 1024x1024 could end.
      await expect.poll(() => server.engine.load(), { timeout: 10_000, interval: 20 }).toEqual({ running: 0, queued: 0 });
      // Short of the 150 steps asked, all of which it runs where the cancel does not reach it. (The step it
      // stopped at is heard at most 50 ms late, which on a fast machine is dozens of steps: no closer bound.)
      expect(server.engine.workers()[0].step).toBeLessThan(150);
      // And it warns of nothing (given a moment more to), nor says the leaving again as Fastify's 'stream
      // closed prematurely', whose status 200 read as an answer delivered.
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(messages().filter((msg) => msg.startsWith('stream '))).toEqual([]);
    } finally {
      (await held)?.();
    }
  });
});

describe('streams and a busy queue', () => {
  it('keeps a waiting stream alive every STREAM_KEEP_ALIVE_SECONDS, and SEND_TIMEOUT_SECONDS does not close it while nothing waits to be sent', async () => {
    const quick = await startRealServer({ apiKey: KEY, env: { WORKERS: '1', SEND_TIMEOUT_SECONDS: '1', STREAM_KEEP_ALIVE_SECONDS: '1' } });
    const post = (body: object, signal?: AbortSignal) =>
      fetch(`${quick.server.url}/v1/images/generations`, {
        method: 'POST',
        headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'demo-shapes', prompt: 'a red circle', response_format: 'b64_json', ...body }),
        signal,
      });
    // Work ahead of the stream that lasts until its client leaves: until the stream had two keep-alives,
    // however fast the machine, its worker held before it begins it. (Work of a fixed size, minutes on a
    // loaded machine, outlasted the test's time; at a seventh of its pixels, as a machine seven times as
    // fast runs it, it ended before the second keep-alive.) Held before its first step, and cancelled
    // before it is let go, it may be small: its steps keep it apart from the stream's.
    const leave = new AbortController();
    let resume = () => {};
    try {
      await expect.poll(() => quick.server.engine.readiness().ready, { timeout: 60_000 }).toBe(true);
      let long: Promise<unknown>;
      ({ sent: long, resume } = await holdNextBatch(quick.server.engine, () => post({ size: '256x256', steps: 150 }, leave.signal).catch(() => undefined)));
      const stream = (await post({ size: '256x256', stream: true })).body!.pipeThrough(new TextDecoderStream());
      let text = '';
      for await (const chunk of stream) {
        text += chunk;
        if (text.match(/^: keep-alive$/gm)?.length === 2) {
          leave.abort();
          resume();
        }
      }
      expect(text.match(/^: keep-alive$/gm)!.length).toBeGreaterThanOrEqual(2);
      expect(text).toMatch(/^event: image_generation\.completed$/m);
      await long;
    } finally {
      leave.abort();
      resume();
      await quick.close();
    }
  });

  it('counts the batches ahead, a request the full queue refuses gets its 429 as plain JSON (not an event after a 200), and a stream opens once queued', async () => {
    // One worker, two places in the queue.
    const busy = await startRealServer({ apiKey: KEY, env: { WORKERS: '1', QUEUE_MAX: '2' } });
    const post = (body: object, signal?: AbortSignal) =>
      fetch(`${busy.server.url}/v1/images/generations`, {
        method: 'POST',
        headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256', response_format: 'b64_json', ...body }),
        signal,
      });
    const streamed = { stream: true, stream_progress: true };
    const leave = new AbortController();
    // The running batch is held before its worker begins it while the queue behind it is asked about:
    // unheld, at 256x256 a machine sixteen times as fast as one that ran 1024x1024 in time had ended it
    // and the queue moved on before then. Held, and cancelled before it is let go, it may be small.
    let resume = () => {};
    try {
      await expect.poll(() => busy.server.engine.readiness().ready, { timeout: 60_000 }).toBe(true);
      // Steps told apart, so that the queue does not merge the waiting requests into one batch.
      let running: Promise<unknown>;
      ({ sent: running, resume } = await holdNextBatch(busy.server.engine, () => post({ steps: 150 }, leave.signal).catch(() => undefined)));
      const waiting = post({ steps: 2 }, leave.signal).catch(() => undefined);
      await expect.poll(() => busy.server.engine.load().queued).toBe(1);
      const third = await post({ steps: 3, ...streamed }, leave.signal);
      expect(third.headers.get('content-type')).toMatch(/^text\/event-stream/);
      const firstEvent = new TextDecoder().decode((await third.body!.getReader().read()).value);
      expect(firstEvent).toBe(`event: imagegen.progress\ndata: ${JSON.stringify({ type: 'imagegen.progress', queued_ahead: 1 })}\n\n`);

      const refused = await post({ steps: 4, ...streamed });
      expect(refused.status).toBe(429);
      expect(refused.headers.get('content-type')).toMatch(/^application\/json/);
      expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0);
      expect(((await refused.json()) as ErrorBody).error.code).toBe('rate_limit_exceeded');
      leave.abort();
      resume();
      await Promise.all([running, waiting]);

      // Without stream_progress there is no event to send while it waits: a comment opens the stream as
      // soon as the request is queued, so a client's timeout to the first byte does not run out meanwhile.
      const busyAgain = new AbortController();
      leave.signal.addEventListener('abort', () => busyAgain.abort());
      await expect.poll(() => busy.server.engine.load(), { timeout: 30_000 }).toMatchObject({ running: 0, queued: 0 });
      let long: Promise<unknown>;
      ({ sent: long, resume } = await holdNextBatch(busy.server.engine, () => post({ steps: 150 }, busyAgain.signal).catch(() => undefined)));
      const plain = await post({ steps: 2, stream: true }, busyAgain.signal);
      expect(plain.headers.get('content-type')).toMatch(/^text\/event-stream/);
      expect(new TextDecoder().decode((await plain.body!.getReader().read()).value)).toBe(': queued\n\n');
      expect(busy.server.engine.load()).toMatchObject({ running: 1, queued: 1 });
      busyAgain.abort();
      resume();
      await long;
    } finally {
      leave.abort();
      resume();
      await busy.close();
    }
  });
});
