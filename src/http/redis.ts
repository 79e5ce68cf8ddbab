import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { withoutCredentials } from '../util/url.js';

/**
 * The Redis connection that replicas share limits through (REDIS_URL). A command fails fast while Redis
 * is unreachable (no offline queue, one retry, a 1 s timeout) so that a request never waits on it; the
 * client reconnects by itself, and its users fall back meanwhile (redis-ledger.ts).
 */

export async function connectRedis(url: string, logger: Logger): Promise<Redis> {
  // Loaded only with REDIS_URL: a single server has no use for the client, and it costs start-up time.
  const { Redis } = await import('ioredis');
  const redis = new Redis(url, { lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 1, connectTimeout: 2000, commandTimeout: 1000 });
  // Without a listener ioredis prints every failed reconnection attempt; the users of the connection log what it costs them.
  redis.on('error', () => undefined);
  await redis.connect().then(
    () => logger.info(`shared limits in Redis at ${withoutCredentials(url)}`),
    (err: unknown) => logger.error({ err }, `Redis at ${withoutCredentials(url)} cannot be reached (${(err as Error).message}): each server counts its own limits until it can`),
  );
  return redis;
}

/**
 * A user of the connection falling back while Redis cannot be asked: it says so once when that starts
 * and once when Redis answers again, rather than on every request. `falling` and `back` finish the two
 * log lines with what the fallback costs and what comes back.
 */
export class RedisFallback {
  private failing = false;

  constructor(
    private readonly logger: Logger,
    private readonly falling: string,
    private readonly back: string,
  ) {}

  failed(err: unknown): void {
    if (!this.failing) this.logger.warn({ err }, `Redis cannot be reached (${(err as Error).message}): ${this.falling}`);
    this.failing = true;
  }

  answered(): void {
    if (this.failing) this.logger.info(`Redis answers again: ${this.back}`);
    this.failing = false;
  }
}
