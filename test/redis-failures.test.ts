import { once } from 'node:events';
import { describe, expect, it } from 'vitest';
import { KeyRates } from '../src/http/key-rates.js';
import { connectRedis } from '../src/http/redis.js';
import { ConfigError } from '../src/util/config-error.js';
import { RedisLedger } from '../src/http/redis-ledger.js';
import { capturedLogs } from './helpers/logs.js';
import { NO_REDIS, REDIS_SERVER, useRedis } from './helpers/redis.js';
import { startRedis } from './helpers/services.js';

/**
 * What a replica's log says when REDIS_URL's Redis cannot be used, against a real redis-server: the
 * cause (a password it refuses, a connection refused), at start or when a request falls back to counting
 * alone, and when a Redis that was down at start answers. Before, the lines said ioredis's words for a
 * connection that is down ("Connection is closed.", "Stream isn't writeable and enableOfflineQueue
 * options is false") whatever the cause, and nothing followed the start's error.
 */

interface Line {
  level: number;
  msg: string;
}

const key = { label: 'alice', limits: { requestsPerMinute: 5 } };

describe.skipIf(!REDIS_SERVER)(`the log of a Redis that cannot be used${NO_REDIS}`, () => {
  const redis = useRedis();

  /** A replica's connection and per-key rates on `url`, and the lines they log. */
  async function replica(url: string) {
    const { logger, lines } = capturedLogs<Line>();
    const connection = await connectRedis(url, logger);
    return { connection, rates: new KeyRates(new RedisLedger(connection, logger)), messages: () => lines.map((line) => line.msg), lines };
  }

  it('names a password Redis refuses, at start', async () => {
    const admin = await redis.connect();
    await admin.config('SET', 'requirepass', 'the-right-one');
    const url = new URL(redis.url);
    url.password = 'a-wrong-one';
    const { connection, rates, messages } = await replica(url.href);
    try {
      // The request is still admitted, counted in this replica's memory.
      await expect(rates.admit(key, 1)).resolves.toBeDefined();
      expect(messages()).toEqual([expect.stringMatching(/^Redis at redis:\/\/\[redacted\]@127\.0\.0\.1:\d+\/0 cannot be reached \(WRONGPASS invalid username-password pair.*\): each server counts its own limits until it can$/)]);
    } finally {
      connection.disconnect();
      await admin.config('SET', 'requirepass', '');
    }
  });

  it('refuses a database Redis does not have, as a setting the server cannot use: it would count in database 0, shared', async () => {
    const url = new URL(redis.url);
    url.pathname = '/99';
    const { logger, lines } = capturedLogs<Line>();
    // Before, ioredis carried on in database 0 and the log said 'shared limits in Redis at .../99'.
    await expect(connectRedis(url.href, logger)).rejects.toThrow(
      new ConfigError([`REDIS_URL names database 99, which Redis at ${url.href} does not have (ERR DB index is out of range): name one it has (0 up to its 'databases' setting, 16 by default, less one)`]),
    );
    expect(lines.map((line) => line.msg)).not.toContainEqual(expect.stringMatching(/^shared limits/));
    // One it has is used.
    url.pathname = '/3';
    const { connection, messages } = await replica(url.href);
    connection.disconnect();
    expect(messages()).toEqual([`shared limits in Redis at ${url.href}`]);
  });

  it('names a connection refused when Redis goes away under a request', async () => {
    const { connection, rates, messages } = await replica(redis.url);
    try {
      await redis.stop();
      // Its reconnection refused.
      await once(connection, 'error');
      await expect(rates.admit(key, 1)).resolves.toBeDefined();
      expect(messages().at(-1)).toBe(`Redis failed a command (connect ECONNREFUSED 127.0.0.1:${new URL(redis.url).port}): per-key rates are counted per server until it answers again`);
    } finally {
      connection.disconnect();
    }
  });

  it('names a connection refused at start, and says when that Redis answers', async () => {
    await redis.stop();
    const { connection, rates, messages, lines } = await replica(redis.url);
    const port = Number(new URL(redis.url).port);
    const again = await startRedis(REDIS_SERVER!, port).catch(async (err: unknown) => {
      connection.disconnect();
      throw err;
    });
    try {
      expect(messages()).toEqual([`Redis at ${redis.url} cannot be reached (connect ECONNREFUSED 127.0.0.1:${port}): each server counts its own limits until it can`]);
      await expect.poll(() => connection.status, { timeout: 10_000 }).toBe('ready');
      // The first request since the start asks Redis (nothing failed since to wait a second after).
      await rates.admit(key, 1);
      expect(lines.at(-1)).toMatchObject({ level: 30, msg: 'Redis answers again: per-key rates are shared again' });
    } finally {
      connection.disconnect();
      await again.stop();
    }
  });
});
