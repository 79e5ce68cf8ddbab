import { describe, expect, it, vi } from 'vitest';
import { failureOf } from './helpers/failures.js';
import { ApiError } from '../src/api/errors.js';
import { KeyRates, MemoryLedger } from '../src/http/key-rates.js';

/** API_KEYS_FILE's per-minute limits, on a clock the test moves. */
describe('per-key rates', () => {
  let now = 0;
  const rates = () => new KeyRates(new MemoryLedger(() => now));
  const refusal = (f: () => Promise<unknown>) => failureOf<ApiError>(f());

  it('admits requests_per_minute requests a minute, then answers 429 with the seconds until the oldest leaves', async () => {
    now = 0;
    const r = rates();
    const key = { label: 'alice', limits: { requestsPerMinute: 2 } };
    // OpenAI's rate-limit headers come with each answer: what is left, and when the window frees again.
    expect(await r.admit(key, 1)).toEqual({ 'x-ratelimit-limit-requests': '2', 'x-ratelimit-remaining-requests': '1', 'x-ratelimit-reset-requests': '1m0s' });
    now = 10_000;
    expect(await r.admit(key, 1)).toMatchObject({ 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '50s' });
    now = 20_000;
    const err = await refusal(() => r.admit(key, 1));
    expect(err).toMatchObject({ status: 429, type: 'requests', code: 'rate_limit_exceeded', headers: { 'retry-after': '40', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '40s' } });
    expect(err.message).toMatch(/API key 'alice': at most 2 requests a minute\. Please try again in 40s\.$/);
    now = 69_999.5;
    expect(await r.admit(key, 1)).toMatchObject({ 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '1ms' });
  });

  it('says a whole minute as 60 s, not 61, at any time of the monotonic clock (a difference of two of its readings is off by a fraction of a nanosecond)', async () => {
    // 1_000_000.1 + 60_000 - 1_000_000.1 is 60_000.00000000012 in floating point.
    now = 1_000_000.1;
    const r = rates();
    const key = { label: 'kai', limits: { requestsPerMinute: 1 } };
    expect(await r.admit(key, 1)).toMatchObject({ 'x-ratelimit-reset-requests': '1m0s' });
    expect(await refusal(() => r.admit(key, 1))).toMatchObject({ headers: { 'retry-after': '60', 'x-ratelimit-reset-requests': '1m0s' } });
  });

  it('forgets the keys that spent nothing for a minute: keys rotated out of API_KEYS_FILE leave nothing behind', async () => {
    now = 0;
    const ledger = new MemoryLedger(() => now);
    const r = new KeyRates(ledger);
    // Ten thousand keys (a keys file rotated day after day), each at its limit.
    for (let i = 0; i < 10_000; i++) for (let n = 0; n < 3; n++) await r.admit({ label: `sha256:${i}`, limits: { requestsPerMinute: 3 } }, 1);
    expect(ledger.keys).toBe(10_000);
    now = 60_001;
    await r.admit({ label: 'alice', limits: { requestsPerMinute: 3 } }, 1);
    expect(ledger.keys).toBe(1);
    // A refused or checked request of a key with nothing in its window leaves no entry either.
    await r.check({ label: 'dave', limits: { requestsPerMinute: 3 } }, 1);
    expect(ledger.keys).toBe(1);
  });

  it('counts images_per_minute by n, and refuses a request larger than the limit outright', async () => {
    now = 0;
    const r = rates();
    const key = { label: 'bob', limits: { imagesPerMinute: 4 } };
    expect(await r.admit(key, 3)).toEqual({ 'x-ratelimit-limit-images': '4', 'x-ratelimit-remaining-images': '1', 'x-ratelimit-reset-images': '1m0s' });
    const tooMany = await refusal(() => r.admit(key, 2));
    expect(tooMany.headers['retry-after']).toBe('60');
    // Only its n keeps it out: one image would pass now, and the message says so rather than only to wait.
    expect(tooMany.message).toMatch(/at most 4 images a minute\. This request asks for 2 images, and 1 is left this minute: ask for at most 1 now, or try again in 60s\.$/);
    expect(await r.admit(key, 1)).toMatchObject({ 'x-ratelimit-remaining-images': '0' });
    // Nothing left: waiting is all there is.
    expect((await refusal(() => r.admit(key, 1))).message).toMatch(/at most 4 images a minute\. Please try again in 60s\.$/);
    // More than the limit can never fit: a 429 the SDKs are told not to retry, with no time to wait for.
    const never = await refusal(() => r.admit({ label: 'carol', limits: { imagesPerMinute: 4 } }, 5));
    expect(never).toMatchObject({ status: 429, code: 'rate_limit_exceeded', headers: { 'x-should-retry': 'false' } });
    expect(never.headers['retry-after']).toBeUndefined();
    expect(never.message).toMatch(/asks for 5 images, more than the key may have in a minute \(4 images\)\. Ask for at most 4/);
    // Like every answer to a limited key, with its window as it stands: bob's, which this counted nothing against.
    const bobs = await refusal(() => r.admit(key, 5));
    expect(bobs.headers).toMatchObject({ 'x-ratelimit-limit-images': '4', 'x-ratelimit-remaining-images': '0', 'x-ratelimit-reset-images': '1m0s' });
    expect(await r.admit({ label: 'carol', limits: { imagesPerMinute: 4 } }, 4)).toMatchObject({ 'x-ratelimit-remaining-images': '0' });
  });

  it('checks a request without counting it: one that proves invalid costs nothing', async () => {
    now = 0;
    const r = rates();
    const key = { label: 'dora', limits: { requestsPerMinute: 1, imagesPerMinute: 2 } };
    for (let i = 0; i < 5; i++) await r.check(key, 2);
    await r.admit(key, 2);
    expect((await refusal(() => r.check(key, 1))).headers['retry-after']).toBe('60');
  });

  it('leaves keys without limits, and servers without keys, alone', async () => {
    const r = rates();
    for (let i = 0; i < 100; i++) {
      await r.admit({ label: 'free' }, 10);
      await r.admit(null, 10);
    }
  });
});

describe('per-key rates when the wall clock steps', () => {
  it('admits a key again a minute on, though the wall clock stepped back an hour meanwhile (NTP, a resumed VM)', async () => {
    vi.useFakeTimers({ toFake: ['Date', 'performance'] });
    try {
      const r = new KeyRates();
      const key = { label: 'dave', limits: { requestsPerMinute: 1 } };
      await r.admit(key, 1);
      vi.setSystemTime(Date.now() - 3600_000);
      vi.advanceTimersByTime(61_000);
      // On the wall clock the first request lay in the future, and held the key's one slot for the hour.
      expect(await r.admit(key, 1)).toMatchObject({ 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '1m0s' });
    } finally {
      vi.useRealTimers();
    }
  });
});
