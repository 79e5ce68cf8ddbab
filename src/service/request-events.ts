import { setImmediate } from 'node:timers/promises';
import type { GptImageResponseFields } from '../api/wire.js';
import type { BatchEvent, GeneratedImage, GenerationBatch } from '../runtime/types.js';

/**
 * What a streamed request hears while it runs (the HTTP layer turns these into server-sent events),
 * made from its batches' events and images: progress over all its batches, previews and images
 * numbered as in the response, images handed on in the response's order.
 */

/** Hears a streamed request's progress, its images' previews and the images themselves as they are made. */
export type RequestListener = (event: RequestEvent) => void;

/** What a streamed request hears while it runs, its images numbered as in the response. */
export type RequestEvent =
  /** Waiting for a worker (or the key's `concurrent` slot): other batches waiting in the queue (an upper bound on those ahead: the queue is fair between clients). */
  | { type: 'queued'; ahead: number }
  /** Denoising steps done over all the request's batches. */
  | { type: 'step'; step: number; total: number }
  /** Image `image`'s `index`-th preview, encoded as the image will be, of its size ("WxH"). */
  | { type: 'preview'; image: number; index: number; file: GeneratedImage; size: string }
  /**
   * Image `image`, finished, with the settings and usage the answer repeats: a streamed request's images
   * go out as they are made (in order), so one that another batch's failure ends keeps those made
   * before.
   */
  | { type: 'image'; image: number; file: GeneratedImage; fields: GptImageResponseFields };

/** How often a waiting streamed request hears how many batches wait with it. */
const QUEUED_EVENT_MS = 1000;

/** The response index of each batch's first image. */
const firstImages = (batches: GenerationBatch[]) => batches.map((_, b) => batches.slice(0, b).reduce((n, batch) => n + batch.items.length, 0));

/**
 * Hands on batches' images in the response's order as the batches finish (in any order): image i goes
 * once every image before it has, one per turn of the event loop (each is base64-encoded into a
 * megabytes-long event: a batch's at once would stall every other client). `handedOn` settles once
 * every image handed to `finished` so far has gone.
 */
export function finishedInOrder(batches: GenerationBatch[], onImage: (image: number, file: GeneratedImage) => void) {
  const first = firstImages(batches);
  const done: (GeneratedImage[] | undefined)[] = [];
  let next = 0;
  let handedOn = Promise.resolve();
  // Kept, not thrown in the chain: a request that already failed otherwise never awaits it.
  let failure: { error: unknown } | undefined;
  return {
    finished(batch: number, images: GeneratedImage[]): void {
      done[batch] = images;
      for (; done[next]; next++) {
        for (const [i, file] of done[next]!.entries()) {
          const image = first[next] + i;
          handedOn = handedOn
            .then(async () => {
              await setImmediate();
              onImage(image, file);
            })
            .catch((error: unknown) => void (failure ??= { error }));
        }
      }
    },
    async handedOn(): Promise<void> {
      await handedOn;
      if (failure) throw failure.error;
    },
  };
}

/**
 * A streamed request's events from its batches' events: steps summed over the batches, previews
 * numbered as the response's images, and while it waits for a worker, the batches waiting with it
 * (`queued`: how many batches wait in the queue now, its own included). `started`: whether a worker
 * has taken one of its batches (Ticket.started), which then waits no longer, though its first step may
 * be far off (its model loading). `passes`: the denoiser passes each batch makes (they share their
 * settings; see passesRun).
 */
export function requestProgress(batches: GenerationBatch[], passes: number, queued: () => number, started: () => boolean, onEvent: RequestListener) {
  const firstImage = firstImages(batches);
  // A batch yet to begin counts the passes it will make (`passes`, as its own events will say), so the
  // total stays what it was when the batch begins; only a worker running it in parts (memory, pixels)
  // can tell more, and its events then do.
  const steps = batches.map(() => ({ step: 0, total: passes }));
  // Until its first step, a request whose batch a worker took went on hearing the batches waiting behind
  // it as ahead of it (a model's load takes seconds to a minute), and its own later batches' queueing
  // as its own: it is at the front now.
  let told: number | undefined;
  const tellQueued = () => {
    told = started() ? 0 : Math.max(0, queued() - batches.length);
    onEvent({ type: 'queued', ahead: told });
  };
  let timer: NodeJS.Timeout | undefined;
  // First told once the batches are queued, after their admission settled: a request the queue refuses
  // gets its 429 as a plain error (no event of this comes before it; a wait for the key's slot, in
  // produce, may have opened the stream already), and the count includes its own batches.
  const first = globalThis.setImmediate(() => {
    tellQueued();
    // Taken: told 0 once (a count told while it waited would stand until the first step), then no more.
    timer = setInterval(() => {
      if (!started() || told !== 0) tellQueued();
      if (started()) clearInterval(timer);
    }, QUEUED_EVENT_MS);
  });
  const stop = () => {
    clearImmediate(first);
    clearInterval(timer);
  };
  return {
    listener: (b: number) => (event: BatchEvent) => {
      if (event.type === 'preview') {
        const { width, height } = batches[b];
        onEvent({ type: 'preview', image: firstImage[b] + event.item, index: event.index, file: event.image, size: `${width}x${height}` });
        return;
      }
      stop();
      steps[b] = { step: event.step, total: event.total };
      const sum = (key: 'step' | 'total') => steps.reduce((n, s) => n + s[key], 0);
      onEvent({ type: 'step', step: sum('step'), total: sum('total') });
    },
    stop,
  };
}
