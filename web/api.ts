/**
 * The server's API as the page calls it: same origin, the tab's API key, errors in OpenAI's shape turned
 * into exceptions that keep the `param` they name (the form shows them beside that field).
 */

import type { ErrorBody, ModelObject } from '../src/api/wire.js';

/** The wire types are the server's own (type-only: nothing of the server is bundled into the page). */
/** The server's error, or one the page makes itself (a network failure) with its message alone. */
export type ApiErrorBody = Pick<ErrorBody['error'], 'message'> & Partial<ErrorBody['error']>;
export type Model = ModelObject;

/** An answer in OpenAI's error shape (or a network failure, status 0). */
export class ApiFailure extends Error {
  constructor(
    readonly status: number,
    readonly error: ApiErrorBody,
  ) {
    super(error.message);
  }

  /** The key is missing or refused: ask for it again. */
  get isKeyProblem(): boolean {
    return this.status === 401;
  }
}

const KEY_ITEM = 'imagegen.apiKey';

/** The API key, kept for this tab only: sessionStorage dies with the tab and is not shared with others. */
export const apiKey = {
  get: (): string => sessionStorage.getItem(KEY_ITEM) ?? '',
  set: (key: string): void => sessionStorage.setItem(KEY_ITEM, key.trim()),
  /** Forgotten at the user's word (a shared computer): the tab has no key until one is given again. */
  clear: (): void => sessionStorage.removeItem(KEY_ITEM),
};

/**
 * Why `key` cannot be sent, or undefined when it can: a header carries Latin-1 only, and fetch throws on
 * anything else before a request is made, so such a key was refused by no server and said nothing. The
 * likely cause is a copy that changed it (a word processor's typographic dash or quote).
 */
export function unsendableKey(key: string): string | undefined {
  const char = [...key].find((c) => c.codePointAt(0)! > 0xff);
  if (char === undefined) return undefined;
  const code = `U+${char.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}`;
  return `This key cannot be sent: it has '${char}' (${code}), a character no API key has (keys are plain ASCII). Was a dash or a quote made typographic when it was copied (a word processor, a chat)? Copy the key again from where it was issued.`;
}

/** The error body of a failed answer, whatever came (a proxy's HTML page included). */
async function failureOf(res: Response): Promise<ApiFailure> {
  const text = await res.text();
  try {
    const body = JSON.parse(text) as { error?: ApiErrorBody };
    if (body.error?.message) return new ApiFailure(res.status, body.error);
  } catch {
    // not JSON: reported with the status below
  }
  return new ApiFailure(res.status, { message: `The server answered ${res.status} ${res.statusText}${text ? `: ${text.slice(0, 200)}` : ''}` });
}

/** A call to the API with the tab's key; throws ApiFailure unless the answer is 2xx. */
export async function call(path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  const key = apiKey.get();
  if (key) headers.set('authorization', `Bearer ${key}`);
  let res: Response;
  try {
    res = await fetch(path, { ...init, headers });
  } catch (err) {
    throw connectionLost(err, 'The server could not be reached');
  }
  if (!res.ok) throw await failureOf(res);
  return res;
}

/**
 * A fetch or the read of its answer that failed in the network (the server stopped or restarted, the
 * network dropped), as an ApiFailure that says so and what to do; `what` says when it happened. An abort
 * (Cancel) and an ApiFailure pass through as they are.
 */
export function connectionLost(err: unknown, what: string): unknown {
  if (err instanceof ApiFailure || (err as Error).name === 'AbortError') return err;
  return new ApiFailure(0, { message: `${what} (${(err as Error).message}): check that the server is running and reachable, then try again.` });
}

export async function listModels(): Promise<Model[]> {
  const res = await call('/v1/models');
  return ((await res.json()) as { data: Model[] }).data;
}
