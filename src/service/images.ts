import type { BaseLogger } from 'pino';
import { QueueClosedError, QueueFullError, QueueTimeoutError } from '../engine/job-queue.js';
import type { EnginePool } from '../engine/pool.js';
import { WorkerDiedError } from '../engine/worker-process.js';
import { MAX_SEED, randomSeed } from '../engine/random.js';
import type { BatchItem, GeneratedImage, GenerationBatch } from '../engine/types.js';
import { ApiError, quoteList } from '../api/errors.js';
import type { GenerationRequest, ImageObject, ImagesResponse } from '../api/wire.js';
import type { ModelEntry, ModelRegistry } from '../models/registry.js';
import { checkSchedule } from '../schedulers/index.js';
import { StoreFullError, type ImageStore, type StoredImage } from '../store/image-store.js';
import { bufferView } from '../util/bytes.js';
import { chunks } from '../util/chunks.js';

/**
 * What a generations request means: the model and its preset turn OpenAI's fields into engine
 * batches, the engine draws the pictures, and they come back inline or as stored files' URLs. Errors
 * of the model-dependent checks and of the engine's queue and the store become OpenAI errors here.
 */

export interface ImageServiceDeps {
  registry: ModelRegistry;
  engine: EnginePool;
  store: ImageStore;
}

export interface GenerateContext {
  /** Aborts when the client goes away or shutdown gives up on the request: waiting jobs are dropped, running ones stop. */
  signal: AbortSignal;
  /** The absolute URL of a stored image, as this request's client reaches the server. */
  urlFor(image: StoredImage): string;
  log: Pick<BaseLogger, 'info'>;
}

export interface ImageService {
  generate(request: GenerationRequest, context: GenerateContext): Promise<ImagesResponse>;
}

function unknownModel(id: string, registry: ModelRegistry): ApiError {
  const available = registry.list().map((m) => m.id);
  const hint = available.length ? ` Available models: ${quoteList(available)}.` : ' No models are installed.';
  // OpenAI's images endpoint answers an unknown model with this 400 (other endpoints use 404).
  return new ApiError(400, `The model '${id}' does not exist.${hint}`, {
    type: 'image_generation_user_error',
    param: 'model',
    code: 'invalid_value',
  });
}

function parseSize(request: GenerationRequest, model: ModelEntry): { width: number; height: number } {
  const { sizes, defaultSize } = model.preset;
  const size = request.size === undefined || request.size === 'auto' ? defaultSize : request.size;
  if (!sizes.includes(size)) {
    throw ApiError.invalid('size', 'invalid_value', `Invalid value: '${size}'. Supported values are: ${quoteList(sizes)}.`);
  }
  const [width, height] = size.split('x').map(Number);
  return { width, height };
}

function checkScheduler(request: GenerationRequest, model: ModelEntry): void {
  const allowed = model.schedulers;
  if (request.scheduler !== undefined && !allowed.includes(request.scheduler)) {
    throw ApiError.invalid(
      'scheduler',
      'invalid_value',
      `Invalid value: '${request.scheduler}'. Supported values for model '${request.model}' are: ${quoteList(allowed)}.`,
    );
  }
}

/** Image i gets seed + i, so each image's seed reproduces it alone; wraps past MAX_SEED. */
function seeds(request: GenerationRequest): number[] {
  const base = request.seed ?? randomSeed();
  return Array.from({ length: request.n }, (_, i) => (base + i) % (MAX_SEED + 1));
}

function engineError(err: unknown): unknown {
  if (err instanceof QueueFullError) {
    return new ApiError(
      429,
      `Rate limit reached: all workers are busy and the generation queue is full. Please try again in ${err.retryAfterSeconds}s.`,
      { type: 'requests', code: 'rate_limit_exceeded', headers: { 'retry-after': String(err.retryAfterSeconds) } },
    );
  }
  if (err instanceof QueueTimeoutError) {
    return new ApiError(
      503,
      `The server is overloaded: this request waited ${err.waitedSeconds}s for a free worker without getting one. Please try again in ${err.retryAfterSeconds}s.`,
      { code: 'queue_timeout', headers: { 'retry-after': String(err.retryAfterSeconds) } },
    );
  }
  if (err instanceof WorkerDiedError) {
    return new ApiError(
      500,
      `The worker process generating this image ${err.reason}; it has been replaced. ` +
        'Retrying may succeed; if it keeps failing, ask for a smaller size or fewer images.',
      { code: 'worker_crashed', cause: err },
    );
  }
  if (err instanceof QueueClosedError) return ApiError.shuttingDown();
  return err;
}

function storeError(err: unknown): ApiError {
  if (err instanceof StoreFullError) {
    return new ApiError(507, "The server's image store is full. Ask for response_format 'b64_json', or retry once older images expired.", {
      code: 'storage_full',
      // Retrying at once cannot help; tell the SDKs not to.
      headers: { 'x-should-retry': 'false' },
    });
  }
  const reason = (err as NodeJS.ErrnoException).code ?? 'unknown error';
  return new ApiError(500, `The server could not save the generated image (${reason}). Ask for response_format 'b64_json', or retry later.`, {
    code: 'storage_error',
    cause: err,
  });
}

/**
 * What a request asks the engine for: its size, steps, guidance and scheduler from the model's preset
 * unless the request sets them, one seed per image, split into batches of at most the model's maxBatch.
 * Throws the OpenAI errors of the checks that depend on the model.
 */
export function planBatches(request: GenerationRequest, model: ModelEntry): GenerationBatch[] {
  const { width, height } = parseSize(request, model);
  checkScheduler(request, model);
  const { preset } = model;
  const items: BatchItem[] = seeds(request).map((seed) => ({ prompt: request.prompt, negativePrompt: request.negative_prompt ?? preset.negativePrompt, seed }));
  const settings = {
    modelDir: model.layout.dir,
    modelVersion: model.version,
    width,
    height,
    steps: request.steps ?? preset.steps[request.quality],
    guidanceScale: request.guidance_scale ?? preset.guidanceScale[request.style],
    guidanceRescale: preset.guidanceRescale,
    scheduler: request.scheduler ?? preset.scheduler,
    outputFormat: request.output_format,
    outputCompression: request.output_compression,
    maxBatch: preset.maxBatch,
  };
  try {
    checkSchedule(model.layout.scheduler, settings.scheduler, settings.steps);
  } catch (err) {
    const param = request.steps !== undefined ? 'steps' : 'scheduler';
    throw ApiError.invalid(param, 'invalid_value', `Invalid value for '${param}' with model '${request.model}': ${(err as Error).message}.`);
  }
  return chunks(items, preset.maxBatch).map((part) => ({ ...settings, items: part }));
}

export function createImageService({ registry, engine, store }: ImageServiceDeps): ImageService {
  /** Runs the batches in parallel (they may land on different workers); one failure cancels the rest. */
  async function run(batches: GenerationBatch[], signal: AbortSignal): Promise<GeneratedImage[]> {
    const failed = new AbortController();
    const either = AbortSignal.any([signal, failed.signal]);
    try {
      const results = await Promise.all(
        batches.map((batch) =>
          engine.generate(batch, either).catch((err) => {
            failed.abort(err);
            throw err;
          }),
        ),
      );
      return results.flat();
    } catch (err) {
      throw engineError(err);
    }
  }

  async function deliver(images: GeneratedImage[], request: GenerationRequest, context: GenerateContext): Promise<ImageObject[]> {
    if (request.response_format === 'b64_json') return images.map((image) => ({ b64_json: bufferView(image.data).toString('base64'), seed: image.seed }));
    const results = await Promise.allSettled(images.map((image) => store.put(image.data, image.contentType)));
    const stored = results.flatMap((result) => (result.status === 'fulfilled' ? [result.value] : []));
    const failed = results.find((result) => result.status === 'rejected');
    if (failed) {
      // The response names all its images or none: the ones stored would only take space until they expire.
      await store.remove(stored);
      throw storeError(failed.reason);
    }
    return stored.map((image, i) => ({ url: context.urlFor(image), seed: images[i].seed }));
  }

  return {
    async generate(request, context) {
      const started = performance.now();
      const model = await registry.resolve(request.model);
      if (!model) throw unknownModel(request.model, registry);
      const batches = planBatches(request, model);
      const images = await run(batches, context.signal);
      const [{ width, height, steps }] = batches;
      const generated = performance.now();
      const data = await deliver(images, request, context);
      // The request's logger already names the model, size and n it asked for; these are what ran.
      context.log.info(
        {
          modelId: model.id,
          resolvedSize: `${width}x${height}`,
          steps,
          responseFormat: request.response_format,
          generateMs: Math.round(generated - started),
          deliverMs: Math.round(performance.now() - generated),
        },
        'images generated',
      );
      return { created: Math.floor(Date.now() / 1000), data };
    },
  };
}
