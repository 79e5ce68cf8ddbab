import { describe, expect, it } from 'vitest';
import { KeyRates } from '../src/http/key-rates.js';
import { connectRedis } from '../src/http/redis.js';
import { RedisLedger } from '../src/http/redis-ledger.js';
import { capturedLogs } from './helpers/logs.js';
import { NO_REDIS, REDIS_SERVER, useRedis } from './helpers/redis.js';

/**
 * What a replica's log says when REDIS_URL's Redis cannot be used, against a real redis-server: the
 * cause (a password it refuses, a connection refused), at start and when a request falls back to
 * counting alone. Before, both lines said ioredis's words for a connection that is down ("Connection is
 * closed.", "Stream isn't writeable and enableOfflineQueue options is false"), whatever the cause.
 */

interface Line {
  level: number;
  msg: string;
}

const key = { label: 'alice', limits: { requestsPerMinute: 5 } };

describe.skipIf(!REDIS_SERVER)(`the log of a Redis that cannot be used${NO_REDIS}`, () => {
  const redis = useRedis();

  /** Connects to `url` as a replica starts, then admits one request of a limited key: the lines each logged. */
  async function startAndAdmit(url: string): Promise<{ start: string; request: string }> {
    const { logger, lines } = capturedLogs<Line>();
    const connection = await connectRedis(url, logger);
    try {
      const start = lines.at(-1)!.msg;
      // The request is still admitted: counted in this replica's memory.
      await expect(new KeyRates(new RedisLedger(connection, logger)).admit(key, 1)).resolves.toBeDefined();
      return { start, request: lines.at(-1)!.msg };
    } finally {
      connection.disconnect();
    }
  }

  it('names a password Redis refuses', async () => {
    const admin = await redis.connect();
    await admin.config('SET', 'requirepass', 'the-right-one');
    try {
      const url = new URL(redis.url);
      url.password = 'a-wrong-one';
      const { start, request } = await startAndAdmit(url.href);
      expect(start).toMatch(/^Redis at redis:\/\/\[redacted\]@127\.0\.0\.1:\d+\/0 cannot be reached \(WRONGPASS invalid username-password pair.*\): each server counts its own limits until it can$/);
      expect(request).toMatch(/^Redis failed a command \(WRONGPASS invalid username-password pair.*\): per-key rates are counted per server until it answers again$/);
      expect(`${start} ${request}`).not.toContain('a-wrong-one');
    } finally {
      await admin.config('SET', 'requirepass', '');
    }
  });

  it('names a connection refused', async () => {
    await redis.stop();
    const port = new URL(redis.url).port;
    const { start, request } = await startAndAdmit(redis.url);
    expect(start).toBe(`Redis at ${redis.url} cannot be reached (connect ECONNREFUSED 127.0.0.1:${port}): each server counts its own limits until it can`);
    expect(request).toBe(`Redis failed a command (connect ECONNREFUSED 127.0.0.1:${port}): per-key rates are counted per server until it answers again`);
  });
});
