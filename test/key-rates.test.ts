import { describe, expect, it } from 'vitest';
import { ApiError } from '../src/api/errors.js';
import { KeyRates } from '../src/http/key-rates.js';

/** API_KEYS_FILE's per-minute limits, on a clock the test moves. */
describe('per-key rates', () => {
  let now = 0;
  const rates = () => new KeyRates(() => now);
  const refusal = (f: () => void) => {
    try {
      f();
    } catch (err) {
      return err as ApiError;
    }
    throw new Error('not refused');
  };

  it('admits requests_per_minute requests a minute, then answers 429 with the seconds until the oldest leaves', () => {
    now = 0;
    const r = rates();
    const key = { label: 'alice', limits: { requestsPerMinute: 2 } };
    r.admit(key, 1);
    now = 10_000;
    r.admit(key, 1);
    now = 20_000;
    const err = refusal(() => r.admit(key, 1));
    expect(err).toMatchObject({ status: 429, type: 'requests', code: 'rate_limit_exceeded', headers: { 'retry-after': '40' } });
    expect(err.message).toMatch(/API key 'alice': at most 2 requests a minute/);
    now = 60_001;
    expect(() => r.admit(key, 1)).not.toThrow();
  });

  it('counts images_per_minute by n, and refuses a request larger than the limit outright', () => {
    now = 0;
    const r = rates();
    const key = { label: 'bob', limits: { imagesPerMinute: 4 } };
    r.admit(key, 3);
    expect(refusal(() => r.admit(key, 2)).headers['retry-after']).toBe('60');
    expect(() => r.admit(key, 1)).not.toThrow();
    expect(refusal(() => r.admit(key, 5)).status).toBe(429);
  });

  it('leaves keys without limits, and servers without keys, alone', () => {
    const r = rates();
    for (let i = 0; i < 100; i++) {
      r.admit({ label: 'free' }, 10);
      r.admit(null, 10);
    }
  });
});
