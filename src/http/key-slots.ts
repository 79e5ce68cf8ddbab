import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis, Result } from 'ioredis';
import type { Logger } from 'pino';
import { ApiError } from '../api/errors.js';
import type { ApiKey } from './keys.js';
import { RedisFallback } from './redis.js';

/**
 * A key's `concurrent` limit over every replica (REDIS_URL): a request of such a key holds one of the
 * key's slots while its images are made. The slots are leases in a Redis sorted set (member: a lease
 * id, score: when it runs out), counted and taken in one Lua script so that two replicas never both
 * take the last one, and renewed while the request runs: a replica that dies frees its slots when their
 * leases run out (LEASE_MS) rather than holding them for ever. A renewal (every second) puts back a
 * lease Redis lost (a restart without persistence): the request still runs, and the limit counts it
 * again; a request that took the slot in the second before runs beside it.
 *
 * A request that finds no free slot waits, as it would in the queue for its key's running work to end,
 * until one frees, its client leaves, or the queue's time limit passes (503 queue_timeout, with a
 * Retry-After from when the key's running requests were estimated to end). The key's waiting requests
 * take the slots that free in the order they came, over all replicas: they wait in a second sorted set
 * (score: when each came), and only those first in it may take a free slot. Each asks again every
 * POLL_MS, which renews its place; one whose replica died drops out once that runs out. Our own rather
 * than a lock library: what is needed is a fair counting semaphore with expiring leases, and the
 * script is a few lines. While Redis cannot be reached each replica's queue counts the key's running
 * work on its own (job-queue.ts), so the limit then holds per replica.
 */

/**
 * KEYS: the key's slots, its waiting requests, their places' expiry, the running requests' estimated
 * ends. ARGV: now, limit, the lease's end, its id, the keys' time to live, when the request came, when
 * its place runs out, how long it is estimated to run (ms).
 */
const TAKE = `
local slots, waiting, places, ends = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, id = ARGV[1], ARGV[4]
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', slots, '-inf', now)) do redis.call('HDEL', ends, gone) end
redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', places, '-inf', now)) do redis.call('ZREM', waiting, gone) end
redis.call('ZREMRANGEBYSCORE', places, '-inf', now)
-- A waiting request with no place (Redis evicted that key alone) would otherwise stay first for good.
for _, other in ipairs(redis.call('ZRANGE', waiting, 0, -1)) do
  if other ~= id and not redis.call('ZSCORE', places, other) then redis.call('ZREM', waiting, other) end
end
redis.call('ZADD', waiting, 'NX', ARGV[6], id)
local free = tonumber(ARGV[2]) - redis.call('ZCARD', slots)
local taken = 0
if free > 0 and redis.call('ZRANK', waiting, id) < free then
  redis.call('ZREM', waiting, id)
  redis.call('ZREM', places, id)
  redis.call('ZADD', slots, ARGV[3], id)
  redis.call('HSET', ends, id, tonumber(now) + tonumber(ARGV[8]))
  taken = 1
else
  redis.call('ZADD', places, ARGV[7], id)
end
for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ARGV[5]) end
return taken
`;

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** Defined by KeySlots: 1 when the lease `id` took one of `limit` slots, else 0 (see TAKE). */
    imagegenTakeSlot(
      slots: string,
      waiting: string,
      places: string,
      ends: string,
      now: number,
      limit: number,
      until: number,
      id: string,
      keyTtlMs: number,
      came: number,
      placeUntil: number,
      estimatedMs: number,
    ): Result<number, Context>;
  }
}

const KEY_PREFIX = 'imagegen:slots:';

/** A key's Redis keys: its slots, and (beside them) its waiting requests, their places' expiry and the running requests' estimated ends. */
function keysOf(label: string) {
  const slots = `${KEY_PREFIX}${label}`;
  return { slots, waiting: `${slots}:waiting`, places: `${slots}:places`, ends: `${slots}:ends` };
}

export interface KeySlotsOptions {
  /** How long a lease lasts without renewal: how long a dead replica's slots stay taken. */
  leaseMs?: number;
  /** How often a waiting request asks again. */
  pollMs?: number;
  /** Longest a request waits for a slot (QUEUE_TIMEOUT_SECONDS); undefined: until its client leaves. */
  maxWaitMs?: number;
}

/**
 * How often a running request renews its lease, at most: a lease Redis lost (a restart) is back within
 * this, so waiting requests that see its slot free meanwhile are few.
 */
const RENEW_MS = 1000;

/** How many polls a waiting request's place outlives its last one: a stalled event loop does not lose it, a dead replica's goes. */
const PLACE_POLLS = 10;

export class KeySlots {
  private readonly leaseMs: number;
  private readonly pollMs: number;
  private readonly status: RedisFallback;

  constructor(
    private readonly redis: Redis,
    logger: Logger,
    private readonly options: KeySlotsOptions = {},
  ) {
    this.status = new RedisFallback(logger, "'concurrent' limits hold per server until it can", "'concurrent' limits hold over all servers again");
    this.leaseMs = options.leaseMs ?? 30_000;
    this.pollMs = options.pollMs ?? 200;
    redis.defineCommand('imagegenTakeSlot', { numberOfKeys: 4, lua: TAKE });
  }

  /**
   * Runs `work` holding one of the key's slots; a key without a `concurrent` limit holds none.
   * `estimatedSeconds`: how long the work is expected to take, for the Retry-After of requests that wait for it.
   */
  async hold<T>(key: Omit<ApiKey, 'key'> | null, signal: AbortSignal, work: () => Promise<T>, onWait?: () => void, estimatedSeconds = 0): Promise<T> {
    const limit = key?.limits?.concurrent;
    if (!key || limit === undefined) return work();
    const keys = keysOf(key.label);
    const id = randomBytes(8).toString('hex');
    const estimatedMs = estimatedSeconds * 1000;
    if (!(await this.take(keys, limit, id, signal, key.label, estimatedMs, onWait))) return work();
    // As the script wrote it when the slot was taken.
    const end = Date.now() + estimatedMs;
    const renewal = setInterval(() => {
      // Not XX: a lease Redis lost (a restart) is put back, since the request still runs.
      const renew = this.redis.multi().zadd(keys.slots, Date.now() + this.leaseMs, id).hset(keys.ends, id, end).pexpire(keys.slots, 2 * this.leaseMs).pexpire(keys.ends, 2 * this.leaseMs);
      renew.exec().then(
        () => this.status.answered(),
        (err: unknown) => this.status.failed(err),
      );
    }, Math.min(this.leaseMs / 3, RENEW_MS));
    try {
      return await work();
    } finally {
      clearInterval(renewal);
      await this.redis.multi().zrem(keys.slots, id).hdel(keys.ends, id).exec().catch(() => undefined);
    }
  }

  /** Waits for a slot (calling `onWait` when it begins to wait): true once taken, false when Redis cannot be asked (the work then runs unshared). */
  private async take(keys: ReturnType<typeof keysOf>, limit: number, id: string, signal: AbortSignal, label: string, estimatedMs: number, onWait?: () => void): Promise<boolean> {
    const came = Date.now();
    // Whatever ends the wait but a slot leaves no place behind to hold up the requests after it.
    const leave = () => this.redis.multi().zrem(keys.waiting, id).zrem(keys.places, id).zrem(keys.slots, id).hdel(keys.ends, id).exec().catch(() => undefined);
    for (;;) {
      let taken: number;
      try {
        const now = Date.now();
        const placeUntil = now + PLACE_POLLS * this.pollMs;
        taken = await this.redis.imagegenTakeSlot(keys.slots, keys.waiting, keys.places, keys.ends, now, limit, now + this.leaseMs, id, 2 * this.leaseMs, came, placeUntil, estimatedMs);
      } catch (err) {
        this.status.failed(err);
        // A take that timed out here may still run once a stalled Redis resumes, leaving a lease nobody
        // renews or ends that holds the slot until it runs out. Sent after it on the same connection,
        // this removal runs after it.
        void leave();
        return false;
      }
      this.status.answered();
      if (taken === 1) return true;
      const waited = Date.now() - came;
      // Said once, as the wait begins: a streamed answer opens then (see GenerateContext.hold).
      onWait?.();
      onWait = undefined;
      if (this.options.maxWaitMs !== undefined && waited >= this.options.maxWaitMs) {
        void leave();
        const retry = await this.retryAfter(keys);
        throw new ApiError(503, `API key '${label}' has ${limit} requests running, its 'concurrent' limit over all servers, and this request waited ${Math.round(waited / 1000)}s for one to end. Please try again in ${retry}s.`, {
          code: 'queue_timeout',
          headers: { 'retry-after': String(retry) },
        });
      }
      // The client left: the request ends with its own reason, as it would in the queue.
      await sleep(this.pollMs, undefined, { signal }).catch(() => {
        void leave();
        throw signal.reason;
      });
    }
  }

  /** Seconds until the first of the key's running requests is estimated to end; at least 1 (also when Redis cannot say). */
  private async retryAfter(keys: ReturnType<typeof keysOf>): Promise<number> {
    const ends = await this.redis.hvals(keys.ends).catch((): string[] => []);
    const first = Math.min(...ends.map(Number));
    return Number.isFinite(first) ? Math.max(1, Math.ceil((first - Date.now()) / 1000)) : 1;
  }
}
