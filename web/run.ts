import type { ImageCompletedEvent, ImagePartialEvent, ImageProgressEvent, ImagesResponse, ImageStreamEvent } from '../src/api/wire.js';
import { ApiFailure, call, connectionLost, type ApiErrorBody } from './api.js';
import { bodyOf, EVENT_PREFIX, streams, type ImageRequest } from './request.js';
import { readEvents } from './sse.js';

/**
 * Sends one request and reports what comes back as it comes. Generations and edits are streamed
 * (OpenAI's events, plus our `imagegen.progress` for the queue position and the steps); variations,
 * which OpenAI does not stream, answer once: inline (b64_json) where the page streams the others, so
 * that they too keep nothing on the server, else with URLs. Aborting the signal closes the connection,
 * and the server cancels the work of a client that went away.
 */

export interface FinishedImage {
  /** Its place in the request: image i was made with seed + i. */
  index: number;
  seed: number;
  /** What an <img> shows: the server's URL, or a blob: URL of a streamed picture. */
  src: string;
  /** The server's URL of it (answers with URLs only; they expire). */
  url?: string;
  /** The size it was made at, where the answer says it (gpt-image names: their `auto` is the model's default size). */
  size?: string;
}

export interface RunListener {
  queued(ahead: number): void;
  step(step: number, steps: number): void;
  /** A preview of an image as it forms (a blob: URL); with n > 1 the images' previews come as their batches make them. */
  partial(src: string): void;
  image(image: FinishedImage): void;
}

type StreamedImage = ImagePartialEvent | ImageCompletedEvent;
type StreamEvent = ImageStreamEvent | { error: ApiErrorBody };

function blobUrl(b64: string, format: string): string {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  return URL.createObjectURL(new Blob([bytes], { type: `image/${format}` }));
}

/** How the answer comes: streamed (previews and progress; the pictures arrive inline; a variation's inline at once) or as URLs that the server keeps for a while. */
export interface Delivery {
  stream: boolean;
  partialImages: number;
}

/** An event's data; what is not JSON (a proxy's page in the stream) fails the request with what came instead. */
function parseEvent(data: string, status: number): StreamEvent {
  try {
    return JSON.parse(data) as StreamEvent;
  } catch {
    throw new ApiFailure(status, { message: `The stream brought something that is not an event of this server (${JSON.stringify(data.slice(0, 80))}): is a proxy between the page and the server rewriting it?` });
  }
}

/**
 * The image store's refusals (storage_full, storage_unavailable, storage_error) of an answer with URLs
 * tell an API client to ask for b64_json, a field this page does not show: said in the page's own terms
 * (a stream, and a variation asked for with it, keep nothing on the server).
 */
function storeAdvice(err: unknown): unknown {
  if (!(err instanceof ApiFailure) || !err.error.code?.startsWith('storage_')) return err;
  const message = `${err.message} In this page: set "Answer as" to stream, which keeps nothing on the server.`;
  return new ApiFailure(err.status, { ...err.error, message });
}

export async function runRequest(request: ImageRequest, delivery: Delivery, signal: AbortSignal, on: RunListener): Promise<void> {
  const streamed = delivery.stream && streams(request.route);
  // A variation with "Answer as" stream comes inline: asked for with URLs, the image store's refusals (full,
  // its bucket unreachable) left the page no way to make one.
  const extra: Record<string, string | number | boolean> = streamed ? { stream: true, partial_images: delivery.partialImages, stream_progress: true } : { response_format: delivery.stream ? 'b64_json' : 'url' };
  const { body, headers } = bodyOf(request, extra);
  const res = await call(`/v1/images/${request.route}`, { method: 'POST', body, headers, signal }).catch((err: unknown) => {
    throw delivery.stream ? err : storeAdvice(err);
  });
  const expected = Number(request.fields.n ?? 1);
  let done = 0;
  // The answer can still be cut off once it has begun (the server killed or restarted, the network
  // gone): the read then fails with the browser's bare "network error", said here with what came.
  try {
    if (!streamed) {
      const { data, size, output_format } = (await res.json()) as ImagesResponse;
      // A variation's answer names no format: it is always a PNG.
      data.forEach(({ url, b64_json, seed }, index) => on.image({ index, seed, src: url ?? blobUrl(b64_json!, output_format ?? 'png'), url, size }));
      return;
    }
    const prefix = EVENT_PREFIX[request.route];
    for await (const frame of readEvents(res.body!)) {
      if (frame.data === '[DONE]') continue;
      const event = parseEvent(frame.data, res.status);
      if ('error' in event) throw new ApiFailure(res.status, event.error);
      if (event.type === 'imagegen.progress') {
        const { queued_ahead, step, steps } = event as ImageProgressEvent;
        if (step !== undefined) on.step(step, steps ?? step);
        else if (queued_ahead !== undefined) on.queued(queued_ahead);
      } else if (event.type === `${prefix}.partial_image`) {
        on.partial(blobUrl((event as StreamedImage).b64_json, (event as StreamedImage).output_format));
      } else if (event.type === `${prefix}.completed`) {
        const { seed, b64_json, output_format, size } = event as StreamedImage;
        on.image({ index: done, seed, src: blobUrl(b64_json, output_format), size });
        done++;
      }
    }
  } catch (err) {
    throw connectionLost(err, `The connection to the server was lost after ${done} of ${expected} image${expected === 1 ? '' : 's'}`);
  }
  // Each image ends with its completed event: fewer means the server stopped early.
  if (done < expected) throw new ApiFailure(0, { message: `The stream ended after ${done} of ${expected} images: the server stopped early (see its log).` });
}
