import { ApiError } from '../api/errors.js';
import type { ApiKey } from './keys.js';

/**
 * API_KEYS_FILE's per-minute limits of a key: requests_per_minute and images_per_minute (the sum of its
 * requests' n), over a sliding minute. Our own rather than @fastify/rate-limit because that counts
 * requests only, and one small window serves both measures. A request over either limit gets 429 with
 * the seconds until it would fit; a refused request is not counted.
 */

const MINUTE_MS = 60_000;

interface Spent {
  at: number;
  images: number;
}

export class KeyRates {
  private readonly spent = new Map<string, Spent[]>();

  constructor(private readonly now: () => number = Date.now) {}

  /** Counts a request for `images` images from `key`, or throws the 429 that says when to retry. */
  admit(key: Omit<ApiKey, 'key'> | null, images: number): void {
    const limits = key?.limits;
    if (!key || !limits || (limits.requestsPerMinute === undefined && limits.imagesPerMinute === undefined)) return;
    const now = this.now();
    const recent = (this.spent.get(key.label) ?? []).filter((s) => s.at > now - MINUTE_MS);
    const waits = [
      limits.requestsPerMinute !== undefined && recent.length + 1 > limits.requestsPerMinute ? waitFor(recent, recent.length + 1 - limits.requestsPerMinute, () => 1, now) : 0,
      limits.imagesPerMinute !== undefined ? imageWait(recent, images, limits.imagesPerMinute, now) : 0,
    ];
    const wait = Math.max(...waits);
    if (wait > 0) {
      const seconds = Math.max(1, Math.ceil(wait / 1000));
      throw new ApiError(429, `Rate limit reached for API key '${key.label}': ${describe(limits)}. Please try again in ${seconds}s.`, {
        type: 'requests',
        code: 'rate_limit_exceeded',
        headers: { 'retry-after': String(seconds) },
      });
    }
    this.spent.set(key.label, [...recent, { at: now, images }]);
  }
}

/** Milliseconds until the oldest entries worth `excess` (by `weight`) leave the minute. */
function waitFor(recent: Spent[], excess: number, weight: (s: Spent) => number, now: number): number {
  let freed = 0;
  for (const s of recent) {
    freed += weight(s);
    if (freed >= excess) return s.at + MINUTE_MS - now;
  }
  return MINUTE_MS;
}

function imageWait(recent: Spent[], images: number, limit: number, now: number): number {
  if (images > limit) return MINUTE_MS;
  const used = recent.reduce((sum, s) => sum + s.images, 0);
  return used + images > limit ? waitFor(recent, used + images - limit, (s) => s.images, now) : 0;
}

function describe(limits: NonNullable<ApiKey['limits']>): string {
  const parts = [
    limits.requestsPerMinute !== undefined && plural(limits.requestsPerMinute, 'request'),
    limits.imagesPerMinute !== undefined && plural(limits.imagesPerMinute, 'image'),
  ].filter(Boolean);
  return `at most ${parts.join(' and ')} a minute`;
}

const plural = (n: number, noun: string) => `${n} ${noun}${n === 1 ? '' : 's'}`;
