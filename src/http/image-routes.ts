import type { FastifyReply, FastifyRequest } from 'fastify';
import type { GenerationRequest, ImagesResponse, StreamPrefix } from '../api/wire.js';
import type { EditInput, GenerateContext, ImageService, QueueClient } from '../service/images.js';
import { streamImages } from './event-stream.js';
import { imagePath } from './files.js';
import { imagesJson } from './json-pieces.js';
import { requestOrigin } from './host.js';
import type { KeyRates } from './key-rates.js';
import type { KeySlots } from './key-slots.js';

/** What the image routes (generations, edits, variations) share: their options, and the service context of one request. */

export interface ImagesOptions {
  service: ImageService;
  /** Fixed origin for image URLs; otherwise each request's own (host.ts: proxy headers count when trusted, and are validated). */
  publicBaseUrl?: string;
  /** Put the prompts in the logs; they are the users' private text, so off unless asked for. */
  logPrompts: boolean;
  /** The model of requests that name none (DEFAULT_MODEL). */
  defaultModel: string;
  /** STREAM_KEEP_ALIVE_SECONDS in ms (event-stream.ts). */
  streamKeepAliveMs: number;
  /** API_KEYS_FILE's per-minute limits (shared through Redis with REDIS_URL). */
  rates: KeyRates;
  /** Keys' `concurrent` slots over all replicas (with REDIS_URL). */
  slots?: KeySlots;
}

/**
 * What the three image routes do once they have parsed a request: admit it and run it, answering as
 * server-sent events (`stream`; `prefix` names them) or as one JSON body. An edit's pictures are
 * decoded (`decodeEdit`) only once its key's limits admitted it: a refused request costs no decoding.
 */
export async function respond(
  request: FastifyRequest,
  reply: FastifyReply,
  prefix: StreamPrefix,
  body: GenerationRequest,
  options: ImagesOptions,
  decodeEdit?: () => Promise<EditInput>,
): Promise<ImagesResponse | FastifyReply> {
  const context = await generateContext(request, reply, body, options);
  const edit = await decodeEdit?.();
  if (body.stream) return streamImages(request, reply, { prefix, body, keepAliveMs: options.streamKeepAliveMs }, (onEvent) => options.service.stream(body, context, onEvent, edit));
  return answer(reply, await options.service.generate(body, context, edit));
}

/** A route's answer: one with b64_json images as a stream of JSON pieces (json-pieces.ts), any other as it is. */
function answer(reply: FastifyReply, response: ImagesResponse): ImagesResponse | FastifyReply {
  if (!response.data.some((image) => image.b64_json !== undefined)) return response;
  return reply.type('application/json; charset=utf-8').send(imagesJson(response));
}

/** Who the request is for the queue: fairness is per key (by its label); a key file's `concurrent` limit bounds its running work. */
export const queueClient = (request: FastifyRequest): QueueClient => ({
  client: request.apiKey?.label,
  limits: request.apiKey?.limits?.concurrent === undefined ? undefined : { maxConcurrent: request.apiKey.limits.concurrent },
});

/**
 * The service context of a parsed request, once its key's per-minute limits would admit it (else a 429;
 * the service counts it once it proved valid); from here on its log lines name what it asked for.
 */
async function generateContext(request: FastifyRequest, reply: FastifyReply, body: GenerationRequest, { publicBaseUrl, logPrompts, rates, slots }: ImagesOptions): Promise<GenerateContext> {
  await rates.check(request.apiKey, body.n);
  // Every later line of this request (errors, Fastify's "request completed") names what it asked for.
  request.log = reply.log = request.log.child({
    model: body.model,
    size: body.size ?? 'auto',
    n: body.n,
    ...(logPrompts && { prompt: body.prompt, negativePrompt: body.negative_prompt }),
  });
  const base = publicBaseUrl ?? requestOrigin(request);
  return {
    signal: request.cancellation,
    // A store that hands out its own addresses (S3 presigned URLs) names them; else this server's files route.
    urlFor: (image) => image.url ?? `${base}${imagePath(image)}`,
    log: request.log,
    // OpenAI's x-ratelimit-* headers go on the answer, streamed or not.
    admit: async () => void reply.headers(await rates.admit(request.apiKey, body.n)),
    ...queueClient(request),
    owner: request.apiKey?.owner,
    ...(slots && { hold: (work, onWait, estimatedSeconds) => slots.hold(request.apiKey, request.cancellation, work, onWait, estimatedSeconds) }),
  };
}
