import type { FastifyReply, FastifyRequest } from 'fastify';
import type { ErrorBody, GenerationRequest, ImageStreamEvent, StreamPrefix } from '../api/wire.js';
import { echoedSettings } from '../service/gpt-image-fields.js';
import type { RequestEvent, RequestListener } from '../service/request-events.js';
import { bufferView } from '../util/bytes.js';
import { AnswerEvents } from './answer-memory.js';
import { readableSize } from './echoed-size.js';
import { inPieces } from './json-pieces.js';
import { apiErrorOf } from './errors.js';
import type { MemoryShare } from './memory-share.js';
import { answeredAside } from './metrics.js';
import { errorFields } from './logging.js';

/**
 * A streamed images request (`stream: true`) answered with server-sent events as OpenAI sends them:
 * `<prefix>.partial_image` for each preview, then one `<prefix>.completed` per image, each event's
 * name repeated as `type` in its data (openai-python 1.97 reads only the name; openai-node the data).
 * With `stream_progress` (extension), `imagegen.progress` events too.
 *
 * The answer begins once the request is admitted to the queue, so a request refused before any work (a
 * bad field, a full queue) still gets its plain JSON error and status; or once it waits for its key's
 * `concurrent` slot over all servers (REDIS_URL), after which even the queue's refusal comes as an
 * event (the wait must keep the connection alive). A failure after that comes as an
 * event with OpenAI's error body (`data: {"error": ...}`), which the SDKs raise as an APIError. Without
 * an event to send then, a comment line opens the stream (SSE clients skip comments), and one is sent
 * every STREAM_KEEP_ALIVE_SECONDS (15 s, below the 60 s idle timeout of common proxies: nginx's
 * proxy_read_timeout, AWS load balancers) while nothing else is: a client's
 * timeout to the first byte, or a proxy's idle timeout, does not run out while the request waits for a
 * worker or takes long steps. Each image goes out as a completed event as soon as it is made (see the
 * service's 'image' event); events the client has not read yet count against ANSWER_MEMORY. A client that disconnects cancels the work, as for any request
 * (request.cancellation).
 */

type Produce = (onEvent: RequestListener) => Promise<void>;

export interface StreamOptions {
  /** The events' name prefix (`image_generation`, `image_edit`). */
  prefix: StreamPrefix;
  body: GenerationRequest;
  /** STREAM_KEEP_ALIVE_SECONDS in ms: a comment line goes out after this long without an event. */
  keepAliveMs: number;
  /** The request's share of ANSWER_MEMORY: the events count against it until the response takes them (answer-memory.ts). */
  share: MemoryShare;
}

export async function streamImages(request: FastifyRequest, reply: FastifyReply, { prefix, body, keepAliveMs, share }: StreamOptions, produce: Produce): Promise<FastifyReply> {
  const events = new AnswerEvents(share);
  let opened!: () => void;
  const firstEvent = new Promise<void>((resolve) => (opened = resolve));
  let heartbeat: NodeJS.Timeout | undefined;
  const write = (text: string) => {
    // An image's event is megabytes: written in pieces (see WRITE_PIECE_BYTES).
    for (const piece of inPieces(text)) events.add(piece);
    opened();
    heartbeat?.refresh();
  };
  const send = (event: ImageStreamEvent | ErrorBody) => write(`${'type' in event ? `event: ${event.type}\n` : ''}data: ${JSON.stringify(event)}\n\n`);
  const settings = echoedSettings(body);
  // The size as the client's SDK reads it (echoed-size.ts); where it cannot, `auto`, which every SDK takes.
  const eventSize = (size: string) => readableSize(request, size) ?? 'auto';

  const done = produce((event) => {
    const message = toStreamEvent(event, prefix, body, settings, eventSize);
    if (message) send(message);
    else if (event.type === 'queued' && !heartbeat) write(': queued\n\n');
  });
  // Nothing said yet: a failure is still an ordinary error response.
  await Promise.race([firstEvent, done]);
  const end = () => {
    clearInterval(heartbeat);
    events.finish();
  };
  heartbeat = setInterval(() => write(': keep-alive\n\n'), keepAliveMs);
  // The images went out as they were made ('image' events): the answer itself adds nothing.
  done.then(end, (err: unknown) => {
    // The client left (or stopped reading until the send timeout closed the connection): nobody to
    // tell, and the close was logged and counted (499) as it happened.
    if (reply.raw.destroyed) return end();
    const error = apiErrorOf(err, request);
    send(error.toBody());
    end();
    // The log's "request completed" line says 200, what went out before the failure: this one says how it
    // ended. At info, as that line is: apiErrorOf logged the failure itself at the level it deserves (a
    // cause every request meets, such as a damaged model, once a minute), which a warning per stream undid.
    answeredAside(reply.raw, error.status);
    request.log.info({ status: error.status, ...errorFields(error) }, `stream ended with an error event: ${error.message}`);
  });
  return reply
    .header('content-type', 'text/event-stream; charset=utf-8')
    // no-transform: a proxy that compresses answers (Cloudflare, compression middleware) would hold the
    // events back to fill its blocks.
    .header('cache-control', 'no-cache, no-transform')
    // Proxies (nginx) pass the events on as they come instead of buffering the response.
    .header('x-accel-buffering', 'no')
    .send(events);
}

function toStreamEvent(
  event: RequestEvent,
  prefix: StreamPrefix,
  request: GenerationRequest,
  settings: ReturnType<typeof echoedSettings>,
  eventSize: (size: string) => string,
): ImageStreamEvent | undefined {
  switch (event.type) {
    case 'preview':
      return {
        type: `${prefix}.partial_image`,
        b64_json: bufferView(event.file.data).toString('base64'),
        partial_image_index: event.index,
        created_at: Math.floor(Date.now() / 1000),
        size: eventSize(event.size),
        ...settings,
        seed: event.file.seed,
      };
    case 'queued':
      return request.stream_progress ? { type: 'imagegen.progress', queued_ahead: event.ahead } : undefined;
    case 'step':
      return request.stream_progress ? { type: 'imagegen.progress', step: event.step, steps: event.total } : undefined;
    case 'image':
      return {
        type: `${prefix}.completed`,
        b64_json: bufferView(event.file.data).toString('base64'),
        created_at: Math.floor(Date.now() / 1000),
        size: eventSize(event.fields.size),
        ...settings,
        seed: event.file.seed,
        usage: event.fields.usage,
        ...(event.fields.safety_identifier && { safety_identifier: event.fields.safety_identifier }),
      };
  }
}
