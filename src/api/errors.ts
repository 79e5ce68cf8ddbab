import type { ErrorBody } from './wire.js';

/**
 * Errors in OpenAI's shape, {"error":{"message","type","param","code"}} with all four keys, and with
 * the status the OpenAI SDKs map to the right exception class. Client mistakes must never surface as
 * 5xx: the SDKs retry 5xx twice, running a bad request three times. Thrown by the service and the HTTP
 * layer alike; src/http/errors.ts sends them.
 */

export interface ApiErrorOptions {
  type?: string;
  param?: string | null;
  code?: string | null;
  headers?: Record<string, string>;
  /** What went wrong underneath: logged with the error, never sent to the client. */
  cause?: unknown;
  /** Which limit refused the request (see RateLimit): logged, never sent. */
  limit?: RateLimit;
}

/**
 * The limits a 429 may come from, named as the operator sets them: a key's (API_KEYS_FILE), the queue's,
 * the memory for bodies and for unread answers. OpenAI's code for all of them is `rate_limit_exceeded`, which clients read, so
 * only the log says which it was: a key over its own minute and a server that is full call for different fixes.
 */
export type RateLimit = 'requests_per_minute' | 'images_per_minute' | 'QUEUE_MAX' | 'QUEUE_MAX_SECONDS' | 'UPLOAD_MEMORY' | 'ANSWER_MEMORY';

export class ApiError extends Error {
  readonly type: string;
  readonly param: string | null;
  readonly code: string | null;
  readonly headers: Record<string, string>;
  readonly limit: RateLimit | undefined;

  constructor(
    readonly status: number,
    message: string,
    options: ApiErrorOptions = {},
  ) {
    super(message, { cause: options.cause });
    this.name = 'ApiError';
    this.type = options.type ?? (status >= 500 ? 'server_error' : 'invalid_request_error');
    this.param = options.param ?? null;
    this.code = options.code ?? null;
    this.headers = options.headers ?? {};
    this.limit = options.limit;
  }

  /** The usual 400 for a bad field. */
  static invalid(param: string | null, code: string, message: string): ApiError {
    return new ApiError(400, message, { param, code });
  }

  /** The usual 400 for a required field that is absent. */
  static missing(param: string): ApiError {
    return ApiError.invalid(param, 'missing_required_parameter', `Missing required parameter: '${param}'.`);
  }

  /**
   * The usual 400 for a field the request may not have. Its name is cut as a form's text is (shortened):
   * a JSON key may be as long as the body, and was echoed twice whole (message and param).
   */
  static unknownParameter(param: string): ApiError {
    const name = shortened(param);
    return ApiError.invalid(name, 'unknown_parameter', `Unknown parameter: '${name}'.`);
  }

  /** A 429 in OpenAI's rate-limit shape, from `limit`; its `headers` say when to retry (retry-after), or not to (x-should-retry). */
  static rateLimited(limit: RateLimit, message: string, headers: Record<string, string>): ApiError {
    return new ApiError(429, message, { type: 'requests', code: 'rate_limit_exceeded', headers, limit });
  }

  /** While the server drains for shutdown: retryable, and the SDKs do retry 503. */
  static shuttingDown(): ApiError {
    return new ApiError(503, 'The server is shutting down. Please retry shortly.', {
      code: 'server_shutting_down',
      headers: { 'retry-after': '5' },
    });
  }

  toBody(): ErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/**
 * A text the client sent, as a message quotes it: its first 40 characters and '...' where it is longer.
 * Cut by characters (code points), not UTF-16 units: cut between an emoji's two halves, the message
 * carried a lone surrogate, which JSON.stringify writes as an escape no client shows as a character.
 */
export function shortened(text: string): string {
  const characters = [...text];
  return characters.length > 40 ? `${characters.slice(0, 40).join('')}...` : text;
}

/** "'a'", "'a' and 'b'", "'a', 'b', and 'c'": OpenAI's way of listing supported values ('or' for a choice of one). */
export function quoteList(values: readonly unknown[], conjunction: 'and' | 'or' = 'and'): string {
  const quoted = values.map((v) => `'${String(v)}'`);
  if (quoted.length <= 2) return quoted.join(` ${conjunction} `);
  return `${quoted.slice(0, -1).join(', ')}, ${conjunction} ${quoted.at(-1)}`;
}

/** What a JSON value is, as OpenAI's type errors say it ("but got an array instead"). */
export function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  // JSON has no infinity: a number too large for a double (1e309) parses as one.
  if (typeof value === 'number') return !Number.isFinite(value) ? 'a number too large to represent' : Number.isInteger(value) ? 'an integer' : 'a decimal number';
  if (typeof value === 'object') return 'an object';
  return `a ${typeof value}`;
}
