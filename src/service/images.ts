import { defaultMaxListeners, setMaxListeners } from 'node:events';
import { setImmediate } from 'node:timers/promises';
import type { BaseLogger } from 'pino';
import type { ClientLimits, QueueClosedError, QueueFullError, Ticket } from '../engine/job-queue.js';
import type { NoiseKind } from '../runtime/random.js';
import type { BatchEvent, GeneratedImage, GenerationBatch } from '../runtime/types.js';
import { ApiError } from '../api/errors.js';
import type { GenerationRequest, GptImageResponseFields, ImageObject, ImagesResponse } from '../api/wire.js';
import type { ModelEntry, ModelRegistry } from '../models/registry.js';
import type { ImageStore, StoredImage, StoreReservation } from '../store/image-store.js';
import { bufferView } from '../util/bytes.js';
import { engineError, modelMissing, modelUnusable, queueRefusal, storeError } from './failures.js';
import { gptImageFields } from './gpt-image-fields.js';
import { planBatches, withPicture } from './plan.js';
import { editMarks, fitEdit, type EditSource, type InputImage } from './input-images.js';
import { PromptTokenCounter } from './prompt-tokens.js';
import { finishedInOrder, requestProgress, type RequestListener } from './request-events.js';
import { expectedStoreBytes } from './store-space.js';
import { mostAnswerBytes } from './answer-size.js';
import { unresolvedModel } from './unresolved-model.js';

/**
 * What an images request means, for generations, edits and variations alike: the model and its preset
 * turn OpenAI's fields into engine batches (an edit's batches also carry its picture, mask and
 * strength), the engine draws the pictures, and they come back inline or as stored files' URLs. Errors
 * of the model-dependent checks and of the engine's queue and the store become OpenAI errors here.
 */

/**
 * The strength of edits and variations that name none. An edit without a mask keeps the input's layout
 * and colours only loosely (0.8: most of the schedule runs, so the prompt wins); a masked one repaints
 * its masked area from scratch (1; the rest is kept by the mask); a variation keeps the picture's
 * composition and colours and redraws the details (0.3: with few-step models such as the turbo ones,
 * higher strengths jump to other pictures in their one or two steps; ask for more with `strength`).
 */
const DEFAULT_STRENGTH = { edit: 0.8, inpaint: 1, variation: 0.3 } as const;

/**
 * Abort listeners the engine puts on a request's signal for each of its batches at once (the batch
 * merger's for the member, and while the batch runs, the one that stops it). Every batch of a request
 * shares the one signal, so n = 10 on a model whose max_batch is 1 (FLUX's) passes Node's default of
 * 10, whose "possible memory leak" warning would be a false alarm on stderr: each is removed as its
 * batch settles (test/abort-listeners.test.ts).
 */
const ABORT_LISTENERS_PER_BATCH = 2;

/** What the service uses of the engine (engine/pool.ts's pool, a test's stand-in). */
export interface ImageEngine {
  /**
   * `ticket`: the request the batch belongs to (see ticket()). `onEvent` hears the batch's progress and
   * previews, its items numbered as in `batch`.
   */
  generate(batch: GenerationBatch, signal?: AbortSignal, ticket?: Ticket, onEvent?: (event: BatchEvent) => void): Promise<GeneratedImage[]>;
  /** A request's claim on the queue, which its batches share; `client` for fairness between keys. */
  ticket(batches: readonly GenerationBatch[], client?: string, limits?: ClientLimits): Ticket;
  /** Jobs running and waiting (a stream's `queued` count). */
  load(): { running: number; queued: number };
  /** The refusal the queue would give a request of `client` now (JobQueue.wouldRefuse). */
  wouldRefuse(client?: string, limits?: ClientLimits): QueueFullError | QueueClosedError | undefined;
  /** A place in the queue held while the request waits for its key's slot (JobQueue.waitOutside); the function gives it back. */
  waitOutside(ticket: Ticket): () => void;
}

/** The pictures of an edits or variations request, decoded and checked (input-images.ts). */
export interface EditInput extends EditSource {
  kind: 'edit' | 'variation';
}

export interface ImageServiceDeps {
  registry: ModelRegistry;
  engine: ImageEngine;
  store: ImageStore;
  /** The noise generator of requests that name none (the RNG setting). */
  defaultRng?: NoiseKind;
  /** DEFAULT_MODEL: the model of requests that name none, named in the error when it is not installed. */
  defaultModel?: string;
}

export interface GenerateContext {
  /** Aborts when the client goes away or shutdown gives up on the request: waiting jobs are dropped, running ones stop. */
  signal: AbortSignal;
  /** The absolute URL of a stored image, as this request's client reaches the server. */
  urlFor(image: StoredImage): string;
  log: Pick<BaseLogger, 'info'>;
  /** Counts the request against its key's per-minute limits, once it is known to be valid; throws the 429 when over them. */
  admit?(): Promise<void>;
  /** Who sent the request (an opaque id, e.g. the API key's label): the queue keeps clients fair to each other. The queue's ANONYMOUS_CLIENT when absent. */
  client?: string;
  /** The client's own queue limits, if it has any. */
  limits?: ClientLimits;
  /** Whose images url requests store (the API key's imageOwner id), each key holding at most a share of the store; none without keys. */
  owner?: string;
  /**
   * Runs the making of the images holding what the client may hold at once over all servers (a key's
   * `concurrent` slot), calling `onWait` if it has to wait for one first (see OnWait); `estimatedSeconds`,
   * how long the making is expected to take, tells those that wait behind it when to retry.
   */
  hold?<T>(work: () => Promise<T>, onWait: OnWait, estimatedSeconds: number): Promise<T>;
  /**
   * Sets aside `bytes`, the most an answer with its images in it (b64_json, a stream) may take, before
   * its work is queued (the HTTP layer's ANSWER_MEMORY); calls `onWait` if it has to wait for room first
   * (see OnWait), and throws what refuses the request.
   */
  reserveAnswer?(bytes: number, onWait: OnWait): Promise<void>;
}

/**
 * Called once as a wait outside the queue begins (GenerateContext.hold, reserveAnswer): an error it
 * throws ends the wait, and is the request's. Returns the ms the request has waited already, in its
 * waits before this one: QUEUE_TIMEOUT_SECONDS bounds them all together, its time in the queue too.
 */
export type OnWait = () => number;

/**
 * How a request's images reach its client: `finish` takes them once made (and answers the response's
 * `data`); a streamed request's `onEvent` has had each of them already, as it was made.
 */
interface HowAnswered<T> {
  onEvent?: RequestListener;
  finish(images: GeneratedImage[], reservation: StoreReservation | undefined): Promise<T>;
}

/** The model of a request: as the request named it (for its errors), and the denoiser passes each of its batches makes (for its progress). */
interface RequestModel {
  named: string;
  passes: number;
}

export interface ImageService {
  /** Generates from the prompt alone, or, given `edit`, from its picture (edits and variations), and answers with the images inline or as URLs. */
  generate(request: GenerationRequest, context: GenerateContext, edit?: EditInput): Promise<ImagesResponse>;
  /**
   * The same, streamed (`request.stream`): `onEvent` hears the progress and gets every image as it is
   * made ('image' events); settles once the last went out, or rejects with what ended the request.
   */
  stream(request: GenerationRequest, context: GenerateContext, onEvent: RequestListener, edit?: EditInput): Promise<void>;
  /**
   * Throws what the queue would answer any request of this client now (a 429 when it is full or holds
   * too much work), if it would refuse one: an edit's upload is then not read only to be refused.
   */
  checkRoom(who: QueueClient): void;
}

/** Who a request is for the queue. */
export type QueueClient = Pick<GenerateContext, 'client' | 'limits'>;

function unknownModel(id: string, registry: ModelRegistry, defaultModel: string | undefined): ApiError {
  const { message, unusable } = unresolvedModel(id, registry, defaultModel, 'server');
  // A model installed but broken is the server's fault, not the request's: the 500 of one found broken
  // as it loaded (service/failures.ts), whether or not the request named it (DEFAULT_MODEL).
  if (unusable) return modelUnusable(message);
  // OpenAI's images endpoint answers an unknown model with a 400 (other endpoints use 404).
  return modelMissing(message);
}

/** The images as base64, one per turn of the event loop: ten photo-sized ones take tens of milliseconds. */
async function inlined(images: GeneratedImage[]): Promise<ImageObject[]> {
  const objects: ImageObject[] = [];
  for (const image of images) {
    objects.push({ b64_json: bufferView(image.data).toString('base64'), seed: image.seed });
    await setImmediate();
  }
  return objects;
}

/** An edit's strength and what marks where it repaints; a model that cannot do this edit (its capabilities) is a 400. */
function editPlan(request: GenerationRequest, model: ModelEntry, edit: EditInput): { strength: number; marks?: InputImage } {
  // A variation varies the whole picture: transparency marks nothing there.
  const marks = edit.kind === 'edit' ? editMarks(edit) : undefined;
  const needs = marks ? 'inpainting' : 'image-to-image';
  if (!model.capabilities.includes(needs)) {
    const why = model.layout.vaeEncoder
      ? `${model.layout.family} models cannot do ${needs} here`
      : `its export (${model.id}) lacks vae_encoder/model.onnx. Export it again with its VAE encoder`;
    throw ApiError.invalid('model', 'unsupported_value', `The model '${request.model}' cannot edit images: ${why}, or name another model.`);
  }
  return { strength: request.strength ?? DEFAULT_STRENGTH[edit.kind === 'variation' ? 'variation' : marks ? 'inpaint' : 'edit'], marks };
}

export function createImageService({ registry, engine, store, defaultRng, defaultModel }: ImageServiceDeps): ImageService {
  const promptTokens = new PromptTokenCounter();

  /**
   * Runs the batches in parallel (they may land on different workers) as one request of the queue; one
   * failure cancels the rest.
   */
  async function run(batches: GenerationBatch[], model: RequestModel, signal: AbortSignal, ticket: Ticket, onEvent?: RequestListener, fields?: GptImageResponseFields): Promise<GeneratedImage[]> {
    const failed = new AbortController();
    const either = AbortSignal.any([signal, failed.signal]);
    setMaxListeners(Math.max(defaultMaxListeners, ABORT_LISTENERS_PER_BATCH * batches.length), either);
    const progress = onEvent && requestProgress(batches, model.passes, () => engine.load().queued, () => ticket.started, onEvent);
    // Images made before another batch failed still go out, before the error that ends the stream
    // (`over`: a batch that finishes after that is too late); to a client that left, nothing does.
    let over = false;
    let withheld = false;
    const inOrder =
      onEvent &&
      fields &&
      finishedInOrder(batches, (image, file) => {
        if (!signal.aborted && !over) onEvent({ type: 'image', image, file, fields });
        else withheld = true;
      });
    try {
      const results = await Promise.all(
        batches.map((batch, b) =>
          engine
            .generate(batch, either, ticket, progress?.listener(b))
            .then((images) => {
              inOrder?.finished(b, images);
              return images;
            })
            // Handing the images on can fail too: that also ends the other batches.
            .catch((err) => {
              failed.abort(err);
              throw err;
            }),
        ),
      );
      // The answer ends once its last image went out.
      await inOrder?.handedOn();
      // Ended (the shutdown's deadline) as its last batch finished, with images not yet handed on: the
      // stream ends with that error, not as if it were whole with some of its images missing.
      if (withheld) throw signal.reason;
      return results.flat();
    } catch (err) {
      await inOrder?.handedOn().catch(() => undefined);
      over = true;
      throw engineError(err, model.named);
    } finally {
      progress?.stop();
    }
  }

  /** For url requests, the store space their images will take, set aside before any is generated. */
  async function reserveSpace(request: GenerationRequest, batches: GenerationBatch[], context: GenerateContext): Promise<StoreReservation | undefined> {
    if (request.response_format === 'b64_json') return undefined;
    try {
      return await store.reserve(expectedStoreBytes(batches), context.owner);
    } catch (err) {
      throw storeError(err);
    }
  }

  async function deliver(images: GeneratedImage[], request: GenerationRequest, context: GenerateContext, reservation?: StoreReservation): Promise<ImageObject[]> {
    if (request.response_format === 'b64_json') return inlined(images);
    const results = await Promise.allSettled(images.map((image) => store.put(image.data, image.contentType, reservation)));
    const stored = results.flatMap((result) => (result.status === 'fulfilled' ? [result.value] : []));
    const failed = results.find((result) => result.status === 'rejected');
    // The response names all its images or none, and a client that left while they were stored is given
    // none: the ones stored would only take space (MAX_STORE_BYTES) until they expire.
    if (failed || context.signal.aborted) {
      await store.remove(stored);
      throw failed ? storeError(failed.reason) : context.signal.reason;
    }
    return stored.map((image, i) => ({ url: context.urlFor(image), seed: images[i].seed }));
  }

  /**
   * Generates the images and hands them to `finish` (delivered in the answer, or nothing more to do for
   * a streamed request, whose images went out as 'image' events), with their store space reserved from
   * before the work starts until `finish` is done.
   */
  async function produce<T>(batches: GenerationBatch[], model: RequestModel, request: GenerationRequest, context: GenerateContext, how: HowAnswered<T>, fields?: GptImageResponseFields) {
    const reservation = await reserveSpace(request, batches, context);
    const { onEvent, finish } = how;
    try {
      const ticket = engine.ticket(batches, context.client, context.limits);
      // Waiting for the key's slot, or for room for the answer, is waiting in a queue too: it holds a
      // place in the queue (refused, a 429, when the queue has none), and a streamed answer opens and
      // keeps alive meanwhile. One place for both waits.
      let place: (() => void) | undefined;
      const waiting: OnWait = () => {
        if (place) return ticket.waited();
        try {
          place = engine.waitOutside(ticket);
        } catch (err) {
          throw queueRefusal(err) ?? err;
        }
        onEvent?.({ type: 'queued', ahead: engine.load().queued });
        return ticket.waited();
      };
      const making = () => {
        place?.();
        return run(batches, model, context.signal, ticket, onEvent, fields);
      };
      const made = async () => {
        // Only an answer that holds memory (b64_json, a stream) has one: the HTTP layer decides which do.
        await context.reserveAnswer?.(mostAnswerBytes(batches, request.stream === true, fields?.safety_identifier), waiting);
        return context.hold ? context.hold(making, waiting, ticket.cost) : making();
      };
      const images = await made().finally(() => place?.());
      const generated = performance.now();
      return { generated, data: await finish(images, reservation) };
    } finally {
      reservation?.release();
    }
  }

  /** What generate and stream share: all but how the images reach the client (`how`). */
  async function handle<T>(request: GenerationRequest, context: GenerateContext, how: HowAnswered<T>, edit?: EditInput) {
    const started = performance.now();
    const model = await registry.resolve(request.model);
    if (!model) throw unknownModel(request.model, registry, defaultModel);
    const plan = edit && editPlan(request, model, edit);
    const planned = planBatches(request, model, defaultRng, plan && { ...plan, picture: edit.image });
    const batches = edit && plan ? withPicture(planned, await fitEdit({ image: edit.image, mask: plan.marks }, planned[0].width, planned[0].height, model.layout.vae.scaleFactor)) : planned;
    // Counted first: a tokenizer that cannot load fails the request before any work is spent on it.
    // Streamed responses carry usage whatever the dialect: OpenAI's completed event has it.
    // Its folder's tokenizer damaged or removed since the scan: answered as a worker's load of it is.
    const textTokens =
      request.dialect === 'gpt-image' || request.stream
        ? await promptTokens.count(model, request.prompt).catch((err: unknown) => {
            throw engineError(err, request.model);
          })
        : undefined;
    await context.admit?.();
    const [{ width, height, steps, strength, passes }] = batches;
    const drawn = { width, height, count: batches.reduce((n, batch) => n + batch.items.length, 0), inputImages: edit ? 1 : 0, vaeScale: model.layout.vae.scaleFactor };
    // Always there for a streamed request (textTokens is counted for it): its images go out with them.
    const fields = textTokens === undefined ? undefined : gptImageFields(request, textTokens, drawn);
    const { data, generated } = await produce(batches, { named: request.model, passes }, request, context, how, fields);
    // The request's logger already names the model, size and n it asked for; these are what ran.
    context.log.info(
      {
        modelId: model.id,
        resolvedSize: `${width}x${height}`,
        steps,
        strength,
        responseFormat: request.response_format,
        generateMs: Math.round(generated - started),
        deliverMs: Math.round(performance.now() - generated),
      },
      'images generated',
    );
    return { created: Math.floor(Date.now() / 1000), data, ...fields };
  }

  return {
    generate: (request, context, edit) => handle(request, context, { finish: (images, reservation) => deliver(images, request, context, reservation) }, edit),
    async stream(request, context, onEvent, edit) {
      await handle(request, context, { onEvent, finish: async () => undefined }, edit);
    },
    checkRoom({ client, limits }) {
      const refusal = engine.wouldRefuse(client, limits);
      if (refusal) throw queueRefusal(refusal);
    },
  };
}
