import multipart from '@fastify/multipart';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../api/errors.js';
import { parseImageRequest, type ImagesResponse } from '../api/wire.js';
import type { EditInput } from '../service/images.js';
import { checkMask, decodeInputImage } from '../service/input-images.js';
import { unsupportedMediaType } from './errors.js';
import { queueClient, respond, type ImagesOptions } from './image-routes.js';
import { formBound, readUpload, type Upload, type UploadLimits, type UploadRoute } from './uploads.js';
import { sendsForm } from './raw-headers.js';
import type { ByteBudget } from '../util/byte-budget.js';

/**
 * POST /v1/images/edits and /v1/images/variations: the generations path (service/images.ts) started
 * from an uploaded picture. Multipart is parsed only here: this plugin's own context registers
 * @fastify/multipart, so the other routes keep answering a form with 415.
 */

/** The diffusion models take one input picture (OpenAI's gpt-image takes up to 16). */
const UPLOAD_LIMITS: UploadLimits = {
  maxImages: 1,
  tooMany: (param) =>
    ApiError.invalid(
      param,
      'too_many_images',
      "Too many images: this server's diffusion models edit one image per request, and this request sends more. Send one image (combine reference pictures into one first).",
    ),
};

/** The largest form these routes take (an edit's: its picture, its mask and the fields), of which UPLOAD_MEMORY gives each key room (body-memory.ts). */
export const LARGEST_FORM_BYTES = Math.max(formBound('edit', UPLOAD_LIMITS), formBound('variation', UPLOAD_LIMITS));

/** The picture and mask of an upload, decoded and checked. */
async function editInput({ images, mask, form }: Upload, route: UploadRoute): Promise<EditInput> {
  const param = form ? 'image' : 'images';
  const [first] = images;
  if (!first) throw ApiError.missing(param);
  if (images.length > UPLOAD_LIMITS.maxImages) throw UPLOAD_LIMITS.tooMany(param);
  const source = { image: await decodeInputImage(first.bytes, first.param), ...(mask && { mask: await decodeInputImage(mask.bytes, mask.param) }) };
  checkMask(source);
  return { ...source, kind: route };
}

/**
 * openai-node 4.x on Node sends a form as a stream made once per call (its node-fetch shim wraps the
 * form's encoder in one Readable), so a retry sends the headers, Content-Length included, and no body:
 * the server waits for it until REQUEST_TIMEOUT_SECONDS and answers 408, which the SDK retries the same
 * way, so an edit refused with a 429 it would have got through a second later failed after two minutes.
 * Its headers say which SDK it is (every openai-node release sends X-Stainless-*). Its browser and Deno
 * builds send a FormData, which a retry resends whole, and report another runtime; under Bun (or with
 * openai/shims/web) it sends a FormData too but reports Node, and loses a retry that would have worked:
 * the headers tell no more, and a retry it cannot make is worse than none.
 */
function cannotResendForm(request: FastifyRequest): boolean {
  const header = (name: string) => request.headers[name];
  const version = header('x-stainless-package-version');
  return header('x-stainless-lang') === 'js' && header('x-stainless-runtime') === 'node' && typeof version === 'string' && version.startsWith('4.');
}

/** The statuses openai-node retries unless told otherwise (its shouldRetry, the same in every major). */
const sdkRetries = (status: number) => status === 408 || status === 409 || status === 429 || status >= 500;

declare module 'fastify' {
  interface FastifyContextConfig {
    /** The route takes only a multipart form, no JSON (variations, as OpenAI's): both are refused with one 415 saying so (errors.ts). */
    formOnly?: boolean;
  }
}

export interface EditsOptions extends ImagesOptions {
  /** UPLOAD_MEMORY: what request bodies may hold together (body-memory.ts); the forms of edits and variations take from it (uploads.ts). */
  memory: ByteBudget;
}

export async function edits(app: FastifyInstance, options: EditsOptions): Promise<void> {
  // Limits are set per request in uploads.ts; throwing on a too-large file makes it a 413, not a silently cut image.
  await app.register(multipart, { throwFileSizeLimit: true });
  // Such an SDK is told not to retry its form (x-should-retry, which every openai-node major obeys): it then
  // raises the answer at once, with its Retry-After for the caller, instead of a 408 minutes later.
  app.addHook('onSend', async (request, reply) => {
    // A form by its Content-Type (sendsForm): an answer before the body's parser is picked (shutdown's
    // 503, from onRequest) went without the header when isMultipart() told it, so the SDK resent the
    // form empty (through a balancer, to another replica that waited for it).
    if (sdkRetries(reply.statusCode) && sendsForm(request) && cannotResendForm(request)) reply.header('x-should-retry', 'false');
  });
  for (const [path, route] of [
    ['/v1/images/edits', 'edit'],
    ['/v1/images/variations', 'variation'],
  ] as const) {
    app.post(path, { config: { formOnly: route === 'variation' } }, async (request, reply): Promise<ImagesResponse | FastifyReply> => {
      // A queue, or a key's per-minute limits, that would refuse the request refuse it before its upload
      // (megabytes) is read: its n is in the form, but a key that has no room for one image has none for any.
      options.service.checkRoom(queueClient(request));
      await options.rates.check(request.apiKey, 1);
      if (request.routeOptions.config.formOnly && !request.isMultipart()) throw unsupportedMediaType(request);
      const upload = await readUpload(request, reply, route, UPLOAD_LIMITS, options.memory);
      const body = parseImageRequest(route, upload.fields, { defaultModel: options.defaultModel, form: upload.form });
      return respond(request, reply, 'image_edit', body, options, () => editInput(upload, route));
    });
  }
}
