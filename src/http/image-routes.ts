import type { FastifyReply, FastifyRequest } from 'fastify';
import type { GenerationRequest, ImagesResponse, StreamPrefix } from '../api/wire.js';
import { echoedBytes } from '../service/answer-size.js';
import type { EditInput, GenerateContext, ImageService, QueueClient } from '../service/images.js';
import type { ByteBudget } from '../util/byte-budget.js';
import { clientOf } from './auth.js';
import { answerShare, holdAnswer, reserveAnswer } from './answer-memory.js';
import { readableSize } from './echoed-size.js';
import { streamImages } from './event-stream.js';
import { imagePath } from './files.js';
import { imagesJson } from './json-pieces.js';
import { requestOrigin } from './host.js';
import type { KeyRates } from './key-rates.js';
import type { KeySlots } from './key-slots.js';
import type { MemoryShare } from './memory-share.js';

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
  /** ANSWER_MEMORY: b64_json answers and streamed events that their clients have not read yet (answer-memory.ts). */
  answerMemory: ByteBudget;
  /** QUEUE_TIMEOUT_SECONDS in ms: the longest a request waits for ANSWER_MEMORY to have room for its answer. */
  answerWaitMs: number;
}

/**
 * What the three image routes do once they have parsed a request: admit it and run it, answering as
 * server-sent events (`stream`; `prefix` names them) or as one JSON body. An edit's pictures are
 * decoded (`decodeEdit`) only once its key's limits admitted it: a refused request costs no decoding.
 * An answer with its images in it (b64_json, and every stream) is refused first while its key's unread
 * answers hold all of ANSWER_MEMORY they may, and has the most it may take set aside before its work
 * is queued.
 */
export async function respond(
  request: FastifyRequest,
  reply: FastifyReply,
  prefix: StreamPrefix,
  body: GenerationRequest,
  options: ImagesOptions,
  decodeEdit?: () => Promise<EditInput>,
): Promise<ImagesResponse | FastifyReply> {
  // A streamed request's images go as b64_json (parseImageRequest sets it).
  const share = body.response_format === 'b64_json' ? answerShare(request, reply, options.answerMemory) : undefined;
  const context = await generateContext(request, reply, body, options, share);
  const edit = await decodeEdit?.();
  if (body.stream && share) return streamImages(request, reply, { prefix, body, keepAliveMs: options.streamKeepAliveMs, share }, (onEvent) => options.service.stream(body, context, onEvent, edit));
  return answer(reply, withReadableSize(request, await options.service.generate(body, context, edit)), share);
}

/** The answer with its `size` (gpt-image answers) as the client's SDK can read it, left out where it cannot (echoed-size.ts). */
function withReadableSize(request: FastifyRequest, response: ImagesResponse): ImagesResponse {
  const { size, ...rest } = response;
  const readable = size === undefined ? undefined : readableSize(request, size);
  return readable === undefined ? rest : { ...rest, size: readable };
}

/**
 * A route's answer: one with b64_json images as a stream of JSON pieces (json-pieces.ts), its images
 * (and the safety identifier it repeats, the client's text of any length) held in ANSWER_MEMORY until
 * the client has it; any other as it is.
 */
function answer(reply: FastifyReply, response: ImagesResponse, share: MemoryShare | undefined): ImagesResponse | FastifyReply {
  const bytes = response.data.reduce((sum, image) => sum + (image.b64_json?.length ?? 0), 0);
  if (bytes === 0 || !share) return response;
  holdAnswer(share, bytes + echoedBytes(response.safety_identifier));
  return reply.type('application/json; charset=utf-8').send(imagesJson(response));
}

/** Who the request is for the queue: fairness is per key (by its label); a key file's `concurrent` limit bounds its running work. */
export const queueClient = (request: FastifyRequest): QueueClient => ({
  client: clientOf(request),
  limits: request.apiKey?.limits?.concurrent === undefined ? undefined : { maxConcurrent: request.apiKey.limits.concurrent },
});

/**
 * The service context of a parsed request, once its key's per-minute limits would admit it (else a 429;
 * the service counts it once it proved valid); from here on its log lines name what it asked for. Its
 * answer's reservation goes to `share`, where its answer holds memory.
 */
async function generateContext(
  request: FastifyRequest,
  reply: FastifyReply,
  body: GenerationRequest,
  { publicBaseUrl, logPrompts, rates, slots, answerMemory, answerWaitMs }: ImagesOptions,
  share: MemoryShare | undefined,
): Promise<GenerateContext> {
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
    ...(share && { reserveAnswer: (bytes, onWait) => reserveAnswer(request, answerMemory, share, bytes, { signal: request.cancellation, maxWaitMs: answerWaitMs, onWait }) }),
  };
}
