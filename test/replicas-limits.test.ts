import { describe, expect, it, vi } from 'vitest';
import { failureOf } from './helpers/failures.js';
import type { ApiError } from '../src/api/errors.js';
import { KeyRates } from '../src/http/key-rates.js';
import { RedisLedger } from '../src/http/redis-ledger.js';
import { silentLogger } from './helpers/logs.js';
import { NO_REDIS, REDIS_SERVER, useRedis, type TestRedis } from './helpers/redis.js';

/**
 * API_KEYS_FILE's per-minute limits kept in a real Redis: two replicas' KeyRates, each with its own
 * connection, count against one limit, with the same answers as the in-memory ledger (test/key-rates.test.ts),
 * and each falls back to counting alone while Redis is down.
 */

let redis: TestRedis;
let now = 0;

/** A replica's rates: its own Redis connection, the shared clock of the test. */
async function replica(): Promise<KeyRates> {
  return new KeyRates(new RedisLedger(await redis.connect(), silentLogger, () => now));
}

const refusal = (admitted: Promise<unknown>) => failureOf<ApiError>(admitted);

describe.skipIf(!REDIS_SERVER)(`per-key limits shared through Redis${NO_REDIS}`, () => {
  redis = useRedis();

  it('counts requests_per_minute over all replicas, with the Retry-After of the oldest request leaving the minute', async () => {
    const [one, two] = [await replica(), await replica()];
    const key = { label: 'alice', limits: { requestsPerMinute: 2 } };
    now = 1_000_000;
    await one.admit(key, 1);
    now += 10_000;
    // The headers count the other replica's request too: the window read back from Redis.
    expect(await two.admit(key, 1)).toEqual({ 'x-ratelimit-limit-requests': '2', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '50s' });
    now += 10_000;
    for (const rates of [one, two]) {
      const err = await refusal(rates.admit(key, 1));
      expect(err).toMatchObject({ status: 429, type: 'requests', code: 'rate_limit_exceeded', headers: { 'retry-after': '40' } });
      expect(err.message).toMatch(/API key 'alice': at most 2 requests a minute/);
    }
    now += 40_001;
    await expect(two.admit(key, 1)).resolves.toBeDefined();
  });

  it('counts images_per_minute by n over all replicas, refusing a request larger than the limit outright', async () => {
    const [one, two] = [await replica(), await replica()];
    const key = { label: 'bob', limits: { imagesPerMinute: 4 } };
    now = 2_000_000;
    await one.admit(key, 3);
    expect((await refusal(two.admit(key, 2))).headers['retry-after']).toBe('60');
    await expect(two.admit(key, 1)).resolves.toBeDefined();
    expect((await refusal(one.admit(key, 1))).status).toBe(429);
    expect((await refusal(one.admit({ label: 'carol', limits: { imagesPerMinute: 4 } }, 5))).status).toBe(429);
  });

  it('checks without counting, on every replica', async () => {
    const [one, two] = [await replica(), await replica()];
    const key = { label: 'fred', limits: { requestsPerMinute: 1 } };
    now = 5_000_000;
    for (let i = 0; i < 3; i++) await Promise.all([one.check(key, 1), two.check(key, 1)]);
    await two.admit(key, 1);
    expect((await refusal(one.check(key, 1))).status).toBe(429);
  });

  it('lets concurrent requests from many replicas through exactly up to the limit', async () => {
    const replicas = await Promise.all([replica(), replica(), replica()]);
    const key = { label: 'dave', limits: { requestsPerMinute: 10 } };
    now = 3_000_000;
    const outcomes = await Promise.allSettled(Array.from({ length: 30 }, (_, i) => replicas[i % 3].admit(key, 1)));
    expect(outcomes.filter((o) => o.status === 'fulfilled')).toHaveLength(10);
  });

  it("times the window by Redis's clock, not by the replicas' own", async () => {
    const connection = await redis.connect();
    // As servers make them: no clock of the test's.
    const [one, two] = [new KeyRates(new RedisLedger(connection, silentLogger)), new KeyRates(new RedisLedger(await redis.connect(), silentLogger))];
    const key = { label: 'gina', limits: { requestsPerMinute: 1 } };
    const [seconds, micros] = await connection.time();
    await one.admit(key, 1);
    const [member] = await connection.zrange('imagegen:rate:gina', '0', '-1');
    const at = Number(member.split(':')[0]);
    expect(at - (Number(seconds) * 1000 + Number(micros) / 1000)).toBeGreaterThanOrEqual(-1);
    expect(at - (Number(seconds) * 1000 + Number(micros) / 1000)).toBeLessThan(5_000);
    // A replica whose clock runs ten minutes ahead still sees the other's request in its minute.
    const ahead = Date.now() + 600_000;
    const clock = vi.spyOn(Date, 'now').mockImplementation(() => ahead);
    const err = await refusal(two.admit(key, 1)).finally(() => clock.mockRestore());
    expect(err.status).toBe(429);
    expect(Number(err.headers['retry-after'])).toBeGreaterThanOrEqual(55);
    expect(Number(err.headers['retry-after'])).toBeLessThanOrEqual(60);
  });

  it("holds a key to its limit for a minute, not for as long as the step, when Redis's clock steps back (NTP, a resumed VM)", async () => {
    const [one, two] = [await replica(), await replica()];
    const key = { label: 'ivan', limits: { requestsPerMinute: 2 } };
    now = 700_000_000;
    await one.admit(key, 1);
    await two.admit(key, 1);
    // Redis's clock steps back a day: its minute's two requests now lie a day in the future.
    now -= 86_400_000;
    const err = await refusal(one.admit(key, 1));
    // Still counted (the step frees no room), but told to wait a minute at most, not a day.
    expect(err.status).toBe(429);
    expect(Number(err.headers['retry-after'])).toBeLessThanOrEqual(60);
    expect(err.headers['x-ratelimit-reset-requests']).toBe('1m0s');
    now += 60_001;
    expect(await two.admit(key, 1)).toMatchObject({ 'x-ratelimit-remaining-requests': '1' });
  });

  it('counts in memory at once while Redis is stalled, after the first request waited out its timeout, and shares again once it answers', async () => {
    const rates = await replica();
    const key = { label: 'hal', limits: { requestsPerMinute: 100 } };
    now = 6_000_000;
    redis.signal('SIGSTOP');
    const times: number[] = [];
    try {
      for (let i = 0; i < 5; i++) {
        const started = performance.now();
        await rates.admit(key, 1);
        times.push(performance.now() - started);
      }
    } finally {
      redis.signal('SIGCONT');
    }
    // The first waits out the command timeout (1 s); the others do not wait for Redis (each waited 1 s, two a request with check).
    // Measured against the first's wait, on this machine as loaded as it is now, rather than a fixed 200 ms.
    expect(times[0]).toBeGreaterThan(900);
    expect(Math.max(...times.slice(1))).toBeLessThan(times[0] / 2);
    // Asked again a second later, Redis counts the key's requests again (the one the stalled Redis ran at last among them).
    await new Promise((resolve) => setTimeout(resolve, 1100));
    expect(await rates.admit(key, 1)).toMatchObject({ 'x-ratelimit-remaining-requests': '98' });
  });

  it('falls back to counting per replica while Redis is down', async () => {
    const [one, two] = [await replica(), await replica()];
    const key = { label: 'erin', limits: { requestsPerMinute: 1 } };
    now = 4_000_000;
    await redis.stop();
    // Each replica alone admits its own one request instead of refusing everyone or stalling.
    await expect(one.admit(key, 1)).resolves.toBeDefined();
    await expect(two.admit(key, 1)).resolves.toBeDefined();
    expect((await refusal(one.admit(key, 1))).status).toBe(429);
  });
});
