/**
 * One request as the page sends it, and as "copy as code" and "reuse settings" replay it: the route, its
 * fields (only those the route takes: the server refuses others as unknown parameters) and the files of
 * an edit or variation.
 */

export type Route = 'generations' | 'edits' | 'variations';
export type Fields = Record<string, string | number>;

export interface ImageRequest {
  route: Route;
  fields: Fields;
  image?: Blob;
  mask?: Blob;
}

const PROMPTED = ['prompt', 'negative_prompt', 'model', 'size', 'n', 'quality', 'style', 'steps', 'guidance_scale', 'seed', 'scheduler', 'output_format'];

/** The settings each route takes (docs/api.md); the streaming fields are added when it is sent. */
export const ROUTE_FIELDS: Record<Route, readonly string[]> = {
  generations: PROMPTED,
  edits: [...PROMPTED, 'strength'],
  variations: ['model', 'size', 'n', 'steps', 'guidance_scale', 'seed', 'scheduler', 'strength'],
};

/** OpenAI streams generations and edits, not variations. */
export const streams = (route: Route): boolean => route !== 'variations';

/** The events of a streamed route are named after it: `image_generation.completed`, `image_edit.partial_image`. */
export const EVENT_PREFIX: Record<Route, string> = { generations: 'image_generation', edits: 'image_edit', variations: 'image_variation' };

/** The file extension of an image in the request's output format. */
export function extensionOf(fields: Fields): string {
  const format = String(fields.output_format ?? 'png');
  return format === 'jpeg' ? 'jpg' : format;
}

/**
 * The name an edit's picture has in the form and in the code's files: its own type's extension (a WebP
 * result is image.webp), so that a saved file is what its name says and a client that types the upload
 * by its name (openai-python does) sends the right one.
 */
export function imageFileName(image: Blob): string {
  const type = /^image\/(png|jpeg|webp)$/.exec(image.type)?.[1] ?? 'png';
  return `image.${type === 'jpeg' ? 'jpg' : type}`;
}

/** The request that makes one of its images again: that image's seed (image i used seed + i), n = 1. */
export function requestForImage(request: ImageRequest, seed: number): ImageRequest {
  return { ...request, fields: { ...request.fields, n: 1, seed } };
}

/**
 * The body to send: JSON for generations, a multipart form (as the SDKs send it) for edits and
 * variations. `extra` adds the page's own fields (streaming, response_format).
 */
export function bodyOf({ route, fields, image, mask }: ImageRequest, extra: Record<string, string | number | boolean>): { body: BodyInit; headers: HeadersInit } {
  const all = { ...fields, ...extra };
  if (route === 'generations') return { body: JSON.stringify(all), headers: { 'content-type': 'application/json' } };
  const form = new FormData();
  if (image) form.append('image', image, imageFileName(image));
  if (mask) form.append('mask', mask, 'mask.png');
  for (const [name, value] of Object.entries(all)) form.append(name, String(value));
  return { body: form, headers: {} };
}
