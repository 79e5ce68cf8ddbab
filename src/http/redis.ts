import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { withoutCredentials } from '../util/url.js';
import { messageOf } from '../util/error-message.js';
import { ConfigError } from '../util/config-error.js';

/**
 * The Redis connection that replicas share limits through (REDIS_URL). A command fails fast while Redis
 * is unreachable (no offline queue, one retry, a 1 s timeout) so that a request never waits on it; the
 * client reconnects by itself, and its users fall back meanwhile (redis-ledger.ts). Commands left
 * unanswered when the connection dropped are not sent again once it is back: their callers were told
 * they failed and moved on, and replayed on a Redis restarted after a stall they acted on what had
 * ended since (a finished request's renewal put its lease back, taking the key's slot for 30 s; rates
 * counted requests again).
 */

export async function connectRedis(url: string, logger: Logger): Promise<Redis> {
  // Loaded only with REDIS_URL: a single server has no use for the client, and it costs start-up time.
  const { Redis } = await import('ioredis');
  const redis = new Redis(url, { lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 1, connectTimeout: 2000, commandTimeout: 1000, autoResendUnfulfilledCommands: false });
  // Without a listener ioredis prints every failed reconnection attempt; the users of the connection log
  // what it costs them, with the reason kept here.
  redis.on('error', (err: unknown) => connectionErrors.set(redis, err));
  redis.on('ready', () => connectionErrors.delete(redis));
  await redis.connect().then(
    async () => {
      await checkDatabase(redis, url);
      logger.info(`shared limits in Redis at ${withoutCredentials(url)}`);
    },
    (failure: unknown) => {
      const err = causeOf(redis, failure);
      logger.error({ err }, `Redis at ${withoutCredentials(url)} cannot be reached (${messageOf(err)}): each server counts its own limits until it can`);
    },
  );
  return redis;
}

/**
 * Refuses (ConfigError: the server does not start) a REDIS_URL whose database Redis does not have:
 * ioredis selects it as it connects, and where it fails ("ERR DB index is out of range") carries on in
 * database 0, which the log called the URL's; deployments kept apart by their database number then
 * shared their keys' limits without a word.
 */
async function checkDatabase(redis: Redis, url: string): Promise<void> {
  const db = redis.options.db ?? 0;
  if (db === 0) return;
  await redis.select(db).catch((err: unknown) => {
    redis.disconnect();
    throw new ConfigError([
      `REDIS_URL names database ${db}, which Redis at ${withoutCredentials(url)} does not have (${messageOf(err)}): name one it has (0 up to its 'databases' setting, 16 by default, less one)`,
    ]);
  });
}

/** The last error each connection reported since it was last ready ('error' events: a connection refused, a password refused). */
const connectionErrors = new WeakMap<Redis, unknown>();

/**
 * Why a command of `redis` failed, for the log. While the connection is down every command fails with
 * ioredis's words for that, and a first connection with "Connection is closed.", whatever the cause: the
 * operator read "cannot be reached (Connection is closed.)" for a wrong password or a host that does not
 * resolve, and went looking at the network. The cause is in the connection's last error.
 */
function causeOf(redis: Redis, err: unknown): unknown {
  return (redis.status === 'ready' ? undefined : connectionErrors.get(redis)) ?? err;
}

/** While Redis fails, how often a user of the connection asks it again (see RedisFallback.shouldAsk). */
const RETRY_MS = 1000;

/**
 * A user of the connection falling back while Redis cannot be asked: it says so once when that starts
 * and once when Redis answers again, rather than on every request. `falling` and `back` finish the two
 * log lines with what the fallback costs and what comes back.
 */
export class RedisFallback {
  /**
   * Failing from the start where Redis could not be reached as the server started (connectRedis said so):
   * the first request that finds it back then says so too. Before, no line ever followed the start's error.
   */
  private failing: boolean;
  /** When Redis last failed, or shouldAsk last let a request ask it while it failed (performance.now()). */
  private askedAt = -Infinity;

  constructor(
    private readonly redis: Redis,
    private readonly logger: Logger,
    private readonly falling: string,
    private readonly back: string,
  ) {
    this.failing = redis.status !== 'ready';
  }

  /**
   * Whether to ask Redis now, rather than fall back at once: always while it answers; while it fails,
   * once every RETRY_MS, so that one request finds out whether it is back and the others do not wait.
   * A Redis that takes connections and answers nothing (stalled, paused, a half-open network) made every
   * request wait out the command timeout (1 s) for each command, two for a key's per-minute limits, and
   * left every one of those commands queued on the connection until Redis answered.
   */
  shouldAsk(): boolean {
    if (!this.failing) return true;
    const now = performance.now();
    if (now - this.askedAt < RETRY_MS) return false;
    this.askedAt = now;
    return true;
  }

  failed(failure: unknown): void {
    const err = causeOf(this.redis, failure);
    if (!this.failing) this.logger.warn({ err }, `Redis failed a command (${messageOf(err)}): ${this.falling}`);
    this.failing = true;
    // The next ask a whole RETRY_MS after this failure, not after the ask that failed (it waited the timeout).
    this.askedAt = performance.now();
  }

  answered(): void {
    if (this.failing) this.logger.info(`Redis answers again: ${this.back}`);
    this.failing = false;
  }
}
