import { QueueClosedError, QueueFullError, QueueTimeoutError } from '../engine/job-queue.js';
import { WorkerOutOfMemoryError } from '../engine/pool.js';
import { WorkerDiedError } from '../engine/worker-process.js';
import { formatBytes } from '../util/bytes.js';
import { ApiError } from '../api/errors.js';
import { MISSING_FOLDER, ModelLayoutError } from '../models/layout.js';
import { InsufficientMemoryError } from '../pipelines/memory-plan.js';
import { NonFiniteOutputError } from '../pipelines/vae.js';
import { GpuFaultError } from '../runtime/gpu-faults.js';
import { GraphMismatchError } from '../runtime/onnx-model.js';
import { StoreFullError, StoreUnavailableError } from '../store/image-store.js';
import { messageOf } from '../util/error-message.js';

/** The engine's and the store's failures as OpenAI errors, with the status and retry advice each deserves. */

/** Retrying at once cannot help (memory that will not be there, a model to repair, a full store): tell the SDKs not to. */
const NO_RETRY = { 'x-should-retry': 'false' };

/** A request refused for memory it would need and cannot have now: a 507 the SDKs do not retry. */
const insufficientMemory = (message: string, cause: unknown) => new ApiError(507, message, { code: 'insufficient_memory', headers: NO_RETRY, cause });

/** The queue's refusals of a new request as OpenAI errors (429, or 503 while shutting down); undefined for any other error. */
export function queueRefusal(err: QueueFullError | QueueClosedError): ApiError;
export function queueRefusal(err: unknown): ApiError | undefined;
export function queueRefusal(err: unknown): ApiError | undefined {
  if (err instanceof QueueFullError) {
    return ApiError.rateLimited(err.limit, `Rate limit reached: all workers are busy and the generation queue is full. Please try again in ${err.retryAfterSeconds}s.`, {
      'retry-after': String(err.retryAfterSeconds),
    });
  }
  if (err instanceof QueueClosedError) return ApiError.shuttingDown();
  return undefined;
}

/** The engine's failures as OpenAI errors; `model` names the request's model in them. */
export function engineError(err: unknown, model: string): unknown {
  const refused = queueRefusal(err);
  if (refused) return refused;
  if (err instanceof QueueTimeoutError) {
    return new ApiError(
      503,
      err.noWorker
        ? `The server cannot generate right now: this request waited ${err.waitedSeconds}s and no worker process was ready to take it (they are starting, or restarting after crashing; /ready and the server's log say why). Please try again in ${err.retryAfterSeconds}s.`
        : err.clientLimit !== undefined
          ? `This request waited ${err.waitedSeconds}s behind this API key's own running requests: the key may run ${err.clientLimit} at once (its 'concurrent' limit). Please try again in ${err.retryAfterSeconds}s, or send fewer requests at once.`
          : `The server is overloaded: this request waited ${err.waitedSeconds}s for a free worker without getting one. Please try again in ${err.retryAfterSeconds}s.`,
      { code: 'queue_timeout', headers: { 'retry-after': String(err.retryAfterSeconds) } },
    );
  }
  if (err instanceof WorkerOutOfMemoryError) {
    return insufficientMemory(
      `The worker process generating this image was killed by the system for running out of memory: model '${err.model}' at ${err.size} needed more than the ${formatBytes(err.plannedBytes)} it was planned with. ` +
        'It has been replaced, and the server now expects this to need more, so it is refused at once until more memory is free. Ask for a smaller size or fewer images, or free memory: fewer WORKERS, a lower MODEL_MEMORY_BUDGET.',
      err,
    );
  }
  if (err instanceof WorkerDiedError) {
    // SIGBUS: a memory-mapped file the worker read (a model's weights) shrank under it, replaced or cut
    // short in place; size and count have nothing to do with it.
    const advice = err.signal === 'SIGBUS'
      ? `A model file it had loaded was probably changed or cut short in place: the server's operator should replace model '${model}' only by installing it anew ("imagegen models import --force", which swaps the folder whole), never by copying over its files.`
      : 'Retrying may succeed; if it keeps failing, ask for a smaller size or fewer images.';
    return new ApiError(500, `The worker process generating this image ${err.reason}; it has been replaced. ${advice}`, { code: 'worker_crashed', cause: err });
  }
  // The worker's errors cross the process boundary as Errors bearing their class's name.
  const name = err instanceof Error ? err.name : undefined;
  // Installed and usable when the request came; since then removed, or found damaged as it loaded
  // (ModelLayoutError crosses the process boundary by name, with its problem).
  if (name === ModelLayoutError.name) {
    const { problem } = err as { problem?: string };
    if (problem === MISSING_FOLDER) {
      return modelMissing(`The model '${model}' was removed from the server while this request waited for it.`, err);
    }
    return modelUnusable(
      `The model '${model}' is installed but could not be loaded: ${problem ?? messageOf(err)}. Other models still work; the server's operator should repair or remove it ("imagegen models list" checks it).`,
      err,
    );
  }
  // Raised in the worker: it crosses the process boundary by name. The export is at fault, and every
  // request for the model meets the same: the 500 of a model to repair, not to be retried.
  if (name === GraphMismatchError.name) {
    return modelUnusable(
      `The model '${model}' is installed but cannot run: ${messageOf(err)}. Its export does not match its family's; other models still work. The server's operator should export it again (optimum-cli export onnx) and import it anew, or remove it.`,
      err,
    );
  }
  // Raised in the worker: it crosses the process boundary by name.
  if (name === InsufficientMemoryError.name) {
    return insufficientMemory(messageOf(err), err);
  }
  // Raised in the worker, which then ends: its replacement has a working CUDA context, so a retry may
  // succeed (the SDKs retry a 500 on their own).
  if (name === GpuFaultError.name) {
    return new ApiError(
      500,
      `The GPU failed while model '${model}' made this image: ${messageOf(err)}. CUDA cannot be used again by the process that met this error, so the worker process has been replaced; retrying may succeed. If it happens again, the server's operator should check the GPU (\`nvidia-smi\`, and the kernel log for NVIDIA Xid errors) or run on the CPU (EXECUTION_PROVIDER=cpu).`,
      { code: 'gpu_fault', cause: err },
    );
  }
  // Raised in the worker: it crosses the process boundary by name. The same request overflows the same
  // way again, so the SDKs are told not to retry.
  if (name === NonFiniteOutputError.name) {
    return new ApiError(500, `Model '${model}' failed to make this image: ${messageOf(err)}`, { code: 'non_finite_output', headers: NO_RETRY, cause: err });
  }
  return err;
}

/** A model the request names that is not installed (or no longer): the 400 OpenAI's images endpoint answers an unknown model with. */
export function modelMissing(message: string, cause?: unknown): ApiError {
  return new ApiError(400, message, { type: 'image_generation_user_error', param: 'model', code: 'invalid_value', cause });
}

/** An installed model that cannot be used: the server's to repair, so a 500 that retrying cannot help. */
export function modelUnusable(message: string, cause?: unknown): ApiError {
  return new ApiError(500, message, { code: 'model_unusable', headers: NO_RETRY, cause });
}

/** When to retry a request the store refused for a passing reason: long enough for a bucket to come back or a running request to end. */
const STORE_RETRY_SECONDS = 5;

/** The store's backend failing (a bucket that cannot be reached): a retryable 503 naming its reason, then `advice`. */
export function storeUnavailable(err: StoreUnavailableError, advice: string): ApiError {
  return new ApiError(503, `The server's image store cannot be used right now (${err.reason}). ${advice}`, {
    code: 'storage_unavailable',
    headers: { 'retry-after': String(STORE_RETRY_SECONDS) },
    cause: err,
  });
}

function storeFull(err: StoreFullError): ApiError {
  const { message, headers } = storeFullAnswer(err);
  return new ApiError(507, message, { code: 'storage_full', headers, cause: err });
}

/** What a full store tells the client, and whether (and when) retrying can help, by why it is full. */
function storeFullAnswer({ reason, neededBytes, maxBytes, retryAfterSeconds, freeBytes, share }: StoreFullError): { message: string; headers: Record<string, string> } {
  const inline = "Ask for response_format 'b64_json'";
  switch (reason) {
    case 'running':
      // Each running request hands back the space it set aside and did not use as it ends.
      return {
        message: `The server's image store is full with the images of requests running now. ${inline}, or retry in a few seconds.`,
        headers: { 'retry-after': String(STORE_RETRY_SECONDS) },
      };
    case 'too-large':
      return {
        message: `This request's images may take up to ${formatBytes(neededBytes)} in the server's image store (counted at the most their format can take), more than the whole store holds (MAX_STORE_BYTES, ${formatBytes(maxBytes)}). ${inline}, or fewer or smaller images; the server's operator can raise MAX_STORE_BYTES.`,
        headers: NO_RETRY,
      };
    case 'disk': {
      // Set aside at the most the format can take: a disk that shows room to spare can still have too little.
      const full =
        freeBytes === undefined
          ? 'is full'
          : `has ${formatBytes(freeBytes)} free, and this request's images may take up to ${formatBytes(neededBytes)} there (counted at the most their format can take)`;
      return {
        message: `The disk holding the server's image store ${full}. ${inline}; the server's operator should free disk space under DATA_DIR, or lower MAX_STORE_BYTES to what the disk can hold.`,
        headers: NO_RETRY,
      };
    }
    case 'share': {
      // Other keys' url requests still find room: this key's wait for its own images (or running requests).
      const held = `This API key's images take as much of the server's image store as one key may (${formatBytes(share?.bytes ?? maxBytes / 2)} of MAX_STORE_BYTES, ${formatBytes(maxBytes)}, so that other keys' images still fit)`;
      if (share?.running) {
        return { message: `${held}, with space set aside for this key's requests running now. ${inline}, or retry in a few seconds.`, headers: { 'retry-after': String(STORE_RETRY_SECONDS) } };
      }
      const when = retryAfterSeconds === undefined ? "once this key's older images expired" : `in ${retryAfterSeconds}s, when enough of this key's older images will have expired`;
      return {
        message: `${held}. ${inline}, or retry ${when}.`,
        headers: { ...NO_RETRY, ...(retryAfterSeconds !== undefined && { 'retry-after': String(retryAfterSeconds) }) },
      };
    }
    case 'images': {
      const when = retryAfterSeconds === undefined ? 'once older images expired' : `in ${retryAfterSeconds}s, when enough older images will have expired`;
      return {
        message: `The server's image store is full (MAX_STORE_BYTES, ${formatBytes(maxBytes)}). ${inline}, or retry ${when}.`,
        headers: { ...NO_RETRY, ...(retryAfterSeconds !== undefined && { 'retry-after': String(retryAfterSeconds) }) },
      };
    }
  }
}

export function storeError(err: unknown): ApiError {
  if (err instanceof StoreUnavailableError) return storeUnavailable(err, "Ask for response_format 'b64_json', or retry shortly.");
  if (err instanceof StoreFullError) return storeFull(err);
  const reason = (err as NodeJS.ErrnoException).code ?? 'unknown error';
  return new ApiError(500, `The server could not save the generated image (${reason}). Ask for response_format 'b64_json', or retry later.`, {
    code: 'storage_error',
    cause: err,
  });
}

