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
 * leases run out (LEASE_MS) rather than holding them for ever.
 *
 * A request that finds no free slot waits, as it would in the queue for its key's running work to end,
 * until one frees, its client leaves, or the queue's time limit passes (503 queue_timeout). Our own
 * rather than a lock library: what is needed is a counting semaphore with expiring leases, and the
 * script is a few lines. While Redis cannot be reached each replica's queue counts the key's running
 * work on its own (job-queue.ts), so the limit then holds per replica.
 */

const TAKE = `
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
`;

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** Defined by KeySlots: 1 when the lease `id` (running out at `until`) took one of `limit` slots, else 0. */
    imagegenTakeSlot(key: string, now: number, limit: number, until: number, id: string, keyTtlMs: number): Result<number, Context>;
  }
}

const KEY_PREFIX = 'imagegen:slots:';

export interface KeySlotsOptions {
  /** How long a lease lasts without renewal: how long a dead replica's slots stay taken. */
  leaseMs?: number;
  /** How often a waiting request asks again. */
  pollMs?: number;
  /** Longest a request waits for a slot (QUEUE_TIMEOUT_SECONDS); undefined: until its client leaves. */
  maxWaitMs?: number;
}

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
    redis.defineCommand('imagegenTakeSlot', { numberOfKeys: 1, lua: TAKE });
  }

  /** Runs `work` holding one of the key's slots; a key without a `concurrent` limit holds none. */
  async hold<T>(key: Omit<ApiKey, 'key'> | null, signal: AbortSignal, work: () => Promise<T>, onWait?: () => void): Promise<T> {
    const limit = key?.limits?.concurrent;
    if (!key || limit === undefined) return work();
    const slots = `${KEY_PREFIX}${key.label}`;
    const id = randomBytes(8).toString('hex');
    if (!(await this.take(slots, limit, id, signal, key.label, onWait))) return work();
    const renewal = setInterval(() => {
      this.redis.zadd(slots, 'XX', Date.now() + this.leaseMs, id).catch(() => undefined);
    }, this.leaseMs / 3);
    try {
      return await work();
    } finally {
      clearInterval(renewal);
      await this.redis.zrem(slots, id).catch(() => undefined);
    }
  }

  /** Waits for a slot (calling `onWait` when it begins to wait): true once taken, false when Redis cannot be asked (the work then runs unshared). */
  private async take(slots: string, limit: number, id: string, signal: AbortSignal, label: string, onWait?: () => void): Promise<boolean> {
    const started = Date.now();
    for (;;) {
      let taken: number;
      try {
        const now = Date.now();
        taken = await this.redis.imagegenTakeSlot(slots, now, limit, now + this.leaseMs, id, 2 * this.leaseMs);
      } catch (err) {
        this.status.failed(err);
        // A take that timed out here may still run once a stalled Redis resumes, leaving a lease nobody
        // renews or ends that holds the slot until it runs out. Sent after it on the same connection,
        // this removal runs after it.
        this.redis.zrem(slots, id).catch(() => undefined);
        return false;
      }
      this.status.answered();
      if (taken === 1) return true;
      const waited = Date.now() - started;
      // Said once, as the wait begins: a streamed answer opens then (see GenerateContext.hold).
      onWait?.();
      onWait = undefined;
      if (this.options.maxWaitMs !== undefined && waited >= this.options.maxWaitMs) {
        const seconds = Math.round(waited / 1000);
        throw new ApiError(503, `API key '${label}' has ${limit} requests running, its 'concurrent' limit over all servers, and this request waited ${seconds}s for one to end. Please try again shortly.`, {
          code: 'queue_timeout',
          headers: { 'retry-after': String(Math.max(1, Math.ceil(this.pollMs / 1000))) },
        });
      }
      // The client left: the request ends with its own reason, as it would in the queue.
      await sleep(this.pollMs, undefined, { signal }).catch(() => {
        throw signal.reason;
      });
    }
  }
}
