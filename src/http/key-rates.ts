import { ApiError } from '../api/errors.js';
import type { ApiKey } from './keys.js';
import { plural } from '../util/plural.js';

/**
 * API_KEYS_FILE's per-minute limits of a key: requests_per_minute and images_per_minute (the sum of its
 * requests' n), over a sliding minute. Our own rather than @fastify/rate-limit because that counts
 * requests only, and one small window serves both measures. A request over either limit gets 429 with
 * the seconds until it would fit; a refused request is not counted, nor is one that turns out invalid:
 * the routes check() a request as it comes (a refusal then costs no work, such as decoding an upload)
 * and admit() it, counting it, once it is known to be valid. A request for more images than the key
 * may have in a minute can never fit: it gets a 429 not to be retried.
 *
 * Where the minute's spending is kept is a ledger: this process's memory (one server), or Redis, which
 * replicas share so that a key's limits hold across all of them (redis-ledger.ts).
 */

const MINUTE_MS = 60_000;

/** One admitted request: when, and how many images it asked for. */
export interface Spent {
  at: number;
  images: number;
}

/** A key's per-minute limits as the ledger checks them. */
export interface WindowLimits {
  requests?: number;
  images?: number;
}

/**
 * What a ledger found: whether the entry fitted, the window before it (oldest first, the entry left
 * out), and the time on the ledger's clock that it counted the entry at.
 */
export interface Spending {
  fits: boolean;
  recent: Spent[];
  at: number;
}

export interface RateLedger {
  /**
   * In one atomic step, at the ledger's time now: forgets `label`'s entries older than `windowMs`; then,
   * if the rest plus an entry of `images` stay within `limits` (fits()), records it (unless `record` is
   * false: a check). The ledger's clock times the window, so that one clock serves every replica.
   */
  spend(label: string, images: number, limits: WindowLimits, windowMs: number, record?: boolean): Promise<Spending>;
}

/** The images the entries asked for. */
const imagesIn = (entries: readonly Spent[]) => entries.reduce((sum, s) => sum + s.images, 0);

/** Whether `recent` plus `entry` stay within `limits`: the rule every ledger applies (redis-ledger.ts in Lua). */
function fits(recent: readonly Spent[], entry: Spent, limits: WindowLimits): boolean {
  const images = imagesIn(recent);
  return (limits.requests === undefined || recent.length + 1 <= limits.requests) && (limits.images === undefined || images + entry.images <= limits.images);
}

/**
 * The ledger of one server: a map in this process, timed by `now` (tests move their own). By default a
 * monotonic clock: on the wall clock, a step back (NTP, a VM resumed) would leave the last minute's
 * entries in the future, counted against their key for as long as the step, an hour's step an hour's refusals.
 */
export class MemoryLedger implements RateLedger {
  /** Each key's entries in the window, oldest first; a key with none has no entry. */
  private readonly spent = new Map<string, Spent[]>();
  /** When keys idle for a window were last dropped (see dropIdle). */
  private droppedAt = -Infinity;

  constructor(private readonly now: () => number = () => performance.now()) {}

  /** How many keys it holds entries of: those that spent within the last window, at most. */
  get keys(): number {
    return this.spent.size;
  }

  async spend(label: string, images: number, limits: WindowLimits, windowMs: number, record = true): Promise<Spending> {
    const entry = { at: this.now(), images };
    this.dropIdle(entry.at, windowMs);
    const recent = (this.spent.get(label) ?? []).filter((s) => s.at > entry.at - windowMs);
    const fit = fits(recent, entry, limits);
    const kept = fit && record ? [...recent, entry] : recent;
    if (kept.length > 0) this.spent.set(label, kept);
    else this.spent.delete(label);
    return { fits: fit, recent, at: entry.at };
  }

  /**
   * Forgets the keys that spent nothing within the window, once a window: a key's entries were filtered
   * only when it spent again, so a key gone from API_KEYS_FILE (rotated, revoked) kept its last
   * minute's entries, up to its limit, for as long as the server ran, and every key ever seen its place.
   */
  private dropIdle(now: number, windowMs: number): void {
    if (now - this.droppedAt < windowMs) return;
    this.droppedAt = now;
    for (const [label, entries] of this.spent) if (entries.at(-1)!.at <= now - windowMs) this.spent.delete(label);
  }
}

/**
 * OpenAI's rate-limit headers for a key's limits over `window`, the minute's entries as of `now` (the
 * request's own among them where it was admitted, not for a refusal): `x-ratelimit-limit-requests`,
 * `-remaining-requests`, `-reset-requests` (when the window frees again, as OpenAI writes it: "1s",
 * "6m0s"), and the same with `-images` for images_per_minute.
 */
function rateHeaders(limits: NonNullable<ApiKey['limits']>, window: readonly Spent[], now: number): Record<string, string> {
  const headers: Record<string, string> = {};
  const measures = [
    ['requests', limits.requestsPerMinute, () => 1],
    ['images', limits.imagesPerMinute, (s: Spent) => s.images],
  ] as const;
  for (const [name, limit, weight] of measures) {
    if (limit === undefined) continue;
    const used = window.reduce((sum, s) => sum + weight(s), 0);
    const oldest = window.find((s) => weight(s) > 0);
    headers[`x-ratelimit-limit-${name}`] = String(limit);
    headers[`x-ratelimit-remaining-${name}`] = String(Math.max(0, limit - used));
    headers[`x-ratelimit-reset-${name}`] = durationText(oldest ? Math.max(0, oldest.at + MINUTE_MS - now) : 0);
  }
  return headers;
}

/**
 * A wait in ms to the microsecond: a difference of two times of the monotonic clock (fractions of a ms)
 * is off by a fraction of a nanosecond, and a whole minute, rounded up, was said as 61 s about one time in a hundred.
 */
const exactMs = (ms: number) => Math.round(ms * 1000) / 1000;

/** Whole seconds, rounded up, of a wait in ms. */
const waitSeconds = (ms: number) => Math.ceil(exactMs(ms) / 1000);

/** Milliseconds as OpenAI's headers write a duration: "350ms", "12s", "1m5s". */
function durationText(ms: number): string {
  if (ms < 1000) return `${Math.ceil(exactMs(ms))}ms`;
  const seconds = waitSeconds(ms);
  return seconds < 60 ? `${seconds}s` : `${Math.floor(seconds / 60)}m${seconds % 60}s`;
}

export class KeyRates {
  constructor(private readonly ledger: RateLedger = new MemoryLedger()) {}

  /** Throws the 429 that `admit` would throw now, counting nothing: for a request not yet known to be valid. */
  async check(key: Pick<ApiKey, 'label' | 'limits'> | null, images: number): Promise<void> {
    await this.spend(key, images, false);
  }

  /** Counts a request for `images` images from `key`, or throws the 429 that says when to retry; returns OpenAI's rate-limit headers for its answer. */
  admit(key: Pick<ApiKey, 'label' | 'limits'> | null, images: number): Promise<Record<string, string>> {
    return this.spend(key, images, true);
  }

  private async spend(key: Pick<ApiKey, 'label' | 'limits'> | null, images: number, record: boolean): Promise<Record<string, string>> {
    const limits = key?.limits;
    if (!key || !limits || (limits.requestsPerMinute === undefined && limits.imagesPerMinute === undefined)) return {};
    const windowLimits = { requests: limits.requestsPerMinute, images: limits.imagesPerMinute };
    if (limits.imagesPerMinute !== undefined && images > limits.imagesPerMinute) {
      // The key's window as it stands (nothing counted), for the rate-limit headers every refusal carries.
      const { recent, at } = await this.ledger.spend(key.label, images, windowLimits, MINUTE_MS, false);
      throw ApiError.rateLimited(
        'images_per_minute',
        `Rate limit reached for API key '${key.label}': this request asks for ${images} images, more than the key may have in a minute (${plural(limits.imagesPerMinute, 'image')}). Ask for at most ${limits.imagesPerMinute} at a time.`,
        // Waiting cannot help: the SDKs are told not to retry.
        { 'x-should-retry': 'false', ...rateHeaders(limits, recent, at) },
      );
    }
    const { fits: admitted, recent, at: now } = await this.ledger.spend(key.label, images, windowLimits, MINUTE_MS, record);
    if (admitted) return rateHeaders(limits, [...recent, { at: now, images }], now);
    const requestLimit = limits.requestsPerMinute;
    const requestsFull = requestLimit !== undefined && recent.length + 1 > requestLimit;
    const wait = Math.max(
      requestsFull ? waitFor(recent, recent.length + 1 - requestLimit, () => 1, now) : 0,
      limits.imagesPerMinute !== undefined ? imageWait(recent, images, limits.imagesPerMinute, now) : 0,
    );
    const seconds = Math.max(1, waitSeconds(wait));
    // Kept out by its n alone, the request would pass now with fewer images: the wait is for all it asks.
    const left = limits.imagesPerMinute === undefined ? 0 : limits.imagesPerMinute - imagesIn(recent);
    const advice =
      !requestsFull && left > 0
        ? `This request asks for ${plural(images, 'image')}, and ${left} ${left === 1 ? 'is' : 'are'} left this minute: ask for at most ${left} now, or try again in ${seconds}s.`
        : `Please try again in ${seconds}s.`;
    throw ApiError.rateLimited(requestsFull ? 'requests_per_minute' : 'images_per_minute', `Rate limit reached for API key '${key.label}': ${describe(limits)}. ${advice}`, {
      'retry-after': String(seconds),
      ...rateHeaders(limits, recent, now),
    });
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
  const used = imagesIn(recent);
  return used + images > limit ? waitFor(recent, used + images - limit, (s) => s.images, now) : 0;
}

function describe(limits: NonNullable<ApiKey['limits']>): string {
  const parts = [
    limits.requestsPerMinute !== undefined && plural(limits.requestsPerMinute, 'request'),
    limits.imagesPerMinute !== undefined && plural(limits.imagesPerMinute, 'image'),
  ].filter(Boolean);
  return `at most ${parts.join(' and ')} a minute`;
}
