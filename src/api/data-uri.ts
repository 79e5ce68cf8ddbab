import { ApiError, describeValue } from './errors.js';

/**
 * The image references of a JSON edits body (`{"image_url": ...}`), as bytes. Only data: URIs: the
 * server never fetches URLs, since fetching what a request names would let any caller make it reach
 * hosts on its network (SSRF), and `file_id`s name OpenAI's file store, which it has no part of.
 */

/** RFC 2397; the scheme and the base64 marker are case-insensitive, as URI schemes are. */
const DATA_URI = /^data:([^,;]*)((?:;[^,;]*)*?)(;base64)?,(.*)$/is;

/** The bytes of one `{"image_url": "data:..."}` reference; `param` names it in errors (e.g. `images[0]`). */
export function imageReferenceBytes(reference: unknown, param: string): Buffer {
  if (typeof reference !== 'object' || reference === null || Array.isArray(reference)) {
    throw ApiError.invalid(param, 'invalid_type', `Invalid type for '${param}': expected an object like {"image_url": "data:image/png;base64,..."}.`);
  }
  const { image_url: url, file_id: fileId, ...rest } = reference as Record<string, unknown>;
  const unknown = Object.keys(rest)[0];
  if (unknown !== undefined) throw ApiError.unknownParameter(`${param}.${unknown}`);
  if (fileId !== undefined && fileId !== null) {
    throw ApiError.invalid(`${param}.file_id`, 'unsupported_value', `Unsupported value: '${param}.file_id': this server has no file store. Send the image inline as a data: URI in 'image_url', or as a multipart upload.`);
  }
  if (url === undefined || url === null) {
    throw ApiError.invalid(`${param}.image_url`, 'missing_required_parameter', `Missing required parameter: '${param}.image_url' (a data: URI such as "data:image/png;base64,...").`);
  }
  if (typeof url !== 'string') {
    throw ApiError.invalid(`${param}.image_url`, 'invalid_type', `Invalid type for '${param}.image_url': expected a string (a data: URI such as "data:image/png;base64,..."), but got ${describeValue(url)} instead.`);
  }
  if (/^https?:/i.test(url)) {
    throw ApiError.invalid(
      `${param}.image_url`,
      'unsupported_value',
      `Unsupported value: '${param}.image_url' is an http(s) URL, and this server does not fetch URLs. Send the image inline as a data: URI ("data:image/png;base64,...") or as a multipart upload.`,
    );
  }
  const match = DATA_URI.exec(url);
  if (!match) {
    throw ApiError.invalid(`${param}.image_url`, 'invalid_value', `Invalid value for '${param}.image_url': expected a data: URI such as "data:image/png;base64,...".`);
  }
  const [, , , base64, payload] = match;
  const bytes = base64 ? base64Bytes(payload) : percentDecoded(payload);
  if (!bytes) {
    throw ApiError.invalid(
      `${param}.image_url`,
      'invalid_value',
      `Invalid value for '${param}.image_url': the data after the comma is not valid ${base64 ? 'base64' : 'percent-encoding (%XX for each byte that is not plain ASCII)'}.`,
    );
  }
  // Which format it is comes from the bytes (input-images.ts), not from the URI's media type.
  return bytes;
}

/** Standard or URL-safe base64, padded or not, whitespace ignored; undefined when it is not base64 (Buffer.from would skip what it cannot read). */
function base64Bytes(text: string): Buffer | undefined {
  const compact = text.replace(/\s+/g, '');
  return /^[A-Za-z0-9+/_-]*={0,2}$/.test(compact) ? Buffer.from(compact, 'base64') : undefined;
}

/** RFC 2397's other form: each %XX is one byte (binary data, not UTF-8 text, so decodeURIComponent will not do), the rest as written. */
function percentDecoded(text: string): Buffer | undefined {
  const raw = Buffer.from(text, 'utf8');
  const out = Buffer.allocUnsafe(raw.length);
  let length = 0;
  for (let i = 0; i < raw.length; i++) {
    if (raw[i] !== 0x25 /* % */) {
      out[length++] = raw[i];
      continue;
    }
    const hex = raw.toString('latin1', i + 1, i + 3);
    if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return undefined;
    out[length++] = Number.parseInt(hex, 16);
    i += 2;
  }
  return out.subarray(0, length);
}
