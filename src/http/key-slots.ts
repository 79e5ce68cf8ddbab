import { randomBytes } from 'node:crypto';
import type { Redis, Result } from 'ioredis';
import type { Logger } from 'pino';
import { ApiError } from '../api/errors.js';
import type { OnWait } from '../service/images.js';
import type { ApiKey } from './keys.js';
import { RedisFallback } from './redis.js';
import { RedisWakeups, Wakeup } from './redis-wakeups.js';

/**
 * A key's `concurrent` limit over every replica (REDIS_URL): a request of such a key holds one of the
 * key's slots while its images are made. The slots are leases in a Redis sorted set (member: a lease
 * id, score: when it runs out), counted and taken in one Lua script so that two replicas never both
 * take the last one, and renewed while the request runs: a replica that dies frees its slots when their
 * leases run out (KeySlotsOptions.leaseMs, 30 s) rather than holding them for ever. A renewal (every
 * second) puts back a lease Redis lost (a restart without persistence): the request still runs, and the
 * limit counts it again; a request that took the slot in the second before runs beside it.
 *
 * A request that finds no free slot waits, as it would in the queue for its key's running work to end,
 * until one frees, its client leaves, or the queue's time limit passes (503 queue_timeout, with a
 * Retry-After from when the key's running requests were estimated to end). The key's waiting requests
 * take the slots that free in the order they came, over all replicas: they wait in a second sorted set
 * (score: when each came), and only those first in it may take a free slot. Each asks again when a
 * request of the key ends or leaves on any replica (a Redis pub/sub message, redis-wakeups.ts), and in
 * any case every poll (KeySlotsOptions.pollMs, 200 ms), which renews its place for PLACE_POLLS polls;
 * one whose replica died drops out once that runs out.
 * Every time kept in Redis (a lease's end, when a request came, its place's expiry, an estimated end)
 * is on Redis's own clock (TIME, read in the scripts): replicas send durations only, so a replica whose
 * clock is off can neither expire the others' leases early nor jump the queue. Our own rather than a
 * lock library: what is needed is a fair counting semaphore with expiring leases, and the script is a
 * few lines. While Redis cannot be reached each replica's queue counts the key's running
 * work on its own (job-queue.ts), so the limit then holds per replica.
 */

/** Redis's time in ms, in a script (allowed before writes: scripts replicate their effects). */
const NOW = `local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
`;

/**
 * KEYS: the key's slots, its waiting requests, their places' expiry, the running requests' estimated
 * ends. ARGV (ms but the limit and id): limit, the lease, its id, the keys' time to live, how long its
 * place lasts, how long it is estimated to run.
 */
const TAKE = `${NOW}
local slots, waiting, places, ends = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[3]
-- No lease ends later than a lease from now, no place expires later than a place from now, nobody came
-- after now: a time past its bound was set before Redis's clock stepped back (NTP, a VM resumed). Left
-- there, a dead replica's slot stayed taken for as long as the step, and the requests waiting then
-- stood behind every one that came after it (those among them now tie, in no particular order).
local function clamp(key, bound)
  local at = string.format('%.17g', bound)
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', key, '(' .. at, '+inf')) do redis.call('ZADD', key, at, member) end
end
clamp(slots, now + tonumber(ARGV[2]))
clamp(places, now + tonumber(ARGV[5]))
clamp(waiting, now)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', slots, '-inf', now)) do redis.call('HDEL', ends, gone) end
redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', places, '-inf', now)) do redis.call('ZREM', waiting, gone) end
redis.call('ZREMRANGEBYSCORE', places, '-inf', now)
-- A waiting request with no place (Redis evicted that key alone) would otherwise stay first for good.
-- Only those that could take a slot now are looked at (the first 'limit'; again while one drops out):
-- looking at every one on every ask made each ask cost as many lookups as requests waited.
local dropped = true
while dropped do
  dropped = false
  for _, other in ipairs(redis.call('ZRANGE', waiting, 0, tonumber(ARGV[1]) - 1)) do
    if other ~= id and not redis.call('ZSCORE', places, other) then
      redis.call('ZREM', waiting, other)
      dropped = true
    end
  end
end
-- Its first ask is when it came.
redis.call('ZADD', waiting, 'NX', now, id)
local free = tonumber(ARGV[1]) - redis.call('ZCARD', slots)
local taken = 0
if free > 0 and redis.call('ZRANK', waiting, id) < free then
  redis.call('ZREM', waiting, id)
  redis.call('ZREM', places, id)
  redis.call('ZADD', slots, now + tonumber(ARGV[2]), id)
  redis.call('HSET', ends, id, now + tonumber(ARGV[6]))
  taken = 1
else
  redis.call('ZADD', places, now + tonumber(ARGV[5]), id)
end
for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ARGV[4]) end
return taken
`;

/**
 * KEYS: the key's slots and estimated ends. ARGV (ms but the id): the lease, its id, how long the
 * request is still estimated to run, the keys' time to live. Not XX: a lease Redis lost (a restart) is
 * put back, since the request still runs, and so is its estimated end. The estimated end is set anew
 * each time, from what this replica's monotonic clock says is left: set once, a step back of Redis's
 * clock left it that far ahead, and the key's timed-out waits were told to retry a day later.
 */
const RENEW = `${NOW}
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], now + tonumber(ARGV[3]))
for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ARGV[4]) end
`;

/**
 * KEYS: the key's waiting requests, their places, its slots, the estimated ends. ARGV: the id. Removes
 * whatever the id has there. A script and not a MULTI of the same commands: Redis that refuses writes
 * for want of memory (maxmemory reached, noeviction) still runs deletions, but refuses every command
 * queued in a MULTI, which left the lease of a finished request taken until it ran out (30 s in which
 * a key with concurrent=1 ran nothing).
 */
const FORGET = `
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
`;

/** KEYS: the key's estimated ends. The ms until the first of them, or -1 when there is none. */
const FIRST_END = `${NOW}
local first = nil
for _, value in ipairs(redis.call('HVALS', KEYS[1])) do
  local at = tonumber(value)
  if first == nil or at < first then first = at end
end
if first == nil then return -1 end
return first - now
`;

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** Defined by KeySlots: 1 when the lease `id` took one of `limit` slots, else 0 (see TAKE). */
    imagegenTakeSlot(
      slots: string,
      waiting: string,
      places: string,
      ends: string,
      limit: number,
      leaseMs: number,
      id: string,
      keyTtlMs: number,
      placeMs: number,
      estimatedMs: number,
    ): Result<number, Context>;
    /** Defined by KeySlots: renews the lease `id` (see RENEW). */
    imagegenRenewSlot(slots: string, ends: string, leaseMs: number, id: string, remainingMs: number, keyTtlMs: number): Result<null, Context>;
    /** Defined by KeySlots: removes every entry of the lease `id` (see FORGET). */
    imagegenForgetSlot(waiting: string, places: string, slots: string, ends: string, id: string): Result<null, Context>;
    /** Defined by KeySlots: ms until the first estimated end of the key's running requests, -1 when none (see FIRST_END). */
    imagegenFirstEnd(ends: string): Result<number, Context>;
  }
}

const KEY_PREFIX = 'imagegen:slots:';

/**
 * A key's Redis keys: its slots, and (beside them) its waiting requests, their places' expiry and the
 * running requests' estimated ends; and the channel that says one of its requests ended or left.
 */
function keysOf(label: string) {
  const slots = `${KEY_PREFIX}${label}`;
  return { slots, waiting: `${slots}:waiting`, places: `${slots}:places`, ends: `${slots}:ends`, freed: `${slots}:freed` };
}

export interface KeySlotsOptions {
  /** How long a lease lasts without renewal: how long a dead replica's slots stay taken. */
  leaseMs?: number;
  /** How often a waiting request asks again, besides when a request of its key ends on any replica. */
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
  private readonly wakeups: RedisWakeups;
  /**
   * The entries of requests that ended or left while Redis could not be asked (a connection that
   * dropped for a moment), and when: removed once it answers again. Left to run out, a request that
   * ended in a blip of the network kept its key's slot for a whole lease (30 s) on every replica.
   * Oldest first; those older than a lease are dropped, as their entries have run out by then.
   */
  private readonly unreleased = new Map<string, { keys: ReturnType<typeof keysOf>; at: number }>();

  constructor(
    private readonly redis: Redis,
    logger: Logger,
    private readonly options: KeySlotsOptions = {},
  ) {
    this.status = new RedisFallback(redis, logger, "'concurrent' limits hold per server until it answers again", "'concurrent' limits hold over all servers again");
    this.leaseMs = options.leaseMs ?? 30_000;
    this.pollMs = options.pollMs ?? 200;
    this.wakeups = new RedisWakeups(redis);
    redis.on('ready', () => {
      for (const [id, { keys }] of this.unreleased) void this.forget(keys, id);
    });
    redis.defineCommand('imagegenTakeSlot', { numberOfKeys: 4, lua: TAKE });
    redis.defineCommand('imagegenRenewSlot', { numberOfKeys: 2, lua: RENEW });
    redis.defineCommand('imagegenFirstEnd', { numberOfKeys: 1, lua: FIRST_END });
    redis.defineCommand('imagegenForgetSlot', { numberOfKeys: 4, lua: FORGET });
  }

  /**
   * Runs `work` holding one of the key's slots; a key without a `concurrent` limit holds none.
   * `estimatedSeconds`: how long the work is expected to take, for the Retry-After of requests that wait for it.
   */
  async hold<T>(key: Pick<ApiKey, 'label' | 'limits'> | null, signal: AbortSignal, work: () => Promise<T>, onWait?: OnWait, estimatedSeconds = 0): Promise<T> {
    const limit = key?.limits?.concurrent;
    if (!key || limit === undefined) return work();
    const keys = keysOf(key.label);
    const id = randomBytes(8).toString('hex');
    const estimatedMs = estimatedSeconds * 1000;
    if (!(await this.take(keys, limit, id, signal, key.label, estimatedMs, onWait))) return work();
    // Durations on this replica's monotonic clock: the times in Redis are on Redis's.
    const took = performance.now();
    const renewal = setInterval(() => {
      const remainingMs = Math.max(0, Math.round(estimatedMs - (performance.now() - took)));
      this.redis.imagegenRenewSlot(keys.slots, keys.ends, this.leaseMs, id, remainingMs, 2 * this.leaseMs).then(
        () => this.status.answered(),
        (err: unknown) => this.status.failed(err),
      );
    }, Math.min(this.leaseMs / 3, RENEW_MS));
    try {
      return await work();
    } finally {
      clearInterval(renewal);
      await this.forget(keys, id);
    }
  }

  /** Waits for a slot (calling `onWait` when it begins to wait): true once taken, false when Redis cannot be asked (the work then runs unshared). */
  private async take(keys: ReturnType<typeof keysOf>, limit: number, id: string, signal: AbortSignal, label: string, estimatedMs: number, onWait?: OnWait): Promise<boolean> {
    let came = performance.now();
    // Whatever ends the wait but a slot leaves no place behind to hold up the requests after it.
    const leave = () => this.forget(keys, id);
    const wakeup = new Wakeup();
    let stopListening: (() => void) | undefined;
    /** Whether Redis took the request's place: only then is there a place to leave. */
    let placed = false;
    try {
      for (;;) {
        // Redis failing a moment ago: the work runs unshared at once, as below.
        if (!this.status.shouldAsk()) {
          if (placed) void leave();
          return false;
        }
        let taken: number;
        try {
          taken = await this.redis.imagegenTakeSlot(keys.slots, keys.waiting, keys.places, keys.ends, limit, this.leaseMs, id, 2 * this.leaseMs, PLACE_POLLS * this.pollMs, estimatedMs);
        } catch (err) {
          this.status.failed(err);
          // A take that timed out here may still run once a stalled Redis resumes, leaving a lease nobody
          // renews or ends that holds the slot until it runs out. Sent after it on the same connection,
          // this removal runs after it.
          void leave();
          return false;
        }
        this.status.answered();
        placed = true;
        if (taken === 1) return true;
        // Said once, as the wait begins: a streamed answer opens then (see GenerateContext.hold). A
        // refusal from it (the queue has no place to wait in) ends the wait. What the request waited
        // before (for room for its answer) counts against maxWaitMs too.
        try {
          // The request's wait began at the earlier of this one's start and its first wait's (its clock includes this one's first ask).
          came = Math.min(came, performance.now() - (onWait?.() ?? 0));
        } catch (err) {
          void leave();
          throw err;
        }
        onWait = undefined;
        const waited = performance.now() - came;
        if (this.options.maxWaitMs !== undefined && waited >= this.options.maxWaitMs) {
          void leave();
          const retry = await this.retryAfter(keys);
          throw new ApiError(503, `API key '${label}' has ${limit} requests running, its 'concurrent' limit over all servers, and this request waited ${Math.round(waited / 1000)}s for one to end. Please try again in ${retry}s.`, {
            code: 'queue_timeout',
            headers: { 'retry-after': String(retry) },
          });
        }
        if (!stopListening) {
          // Asks again once listening, so that a request that ended meanwhile is not missed.
          stopListening = await this.wakeups.listen(keys.freed, wakeup.wake, this.pollMs);
          continue;
        }
        // The client left: the request ends with its own reason, as it would in the queue.
        await wakeup.wait(this.pollMs, signal).catch(() => {
          void leave();
          throw signal.reason;
        });
      }
    } finally {
      stopListening?.();
    }
  }

  /** Closes the connection the wake-ups listen on (the shared one is its owner's to close). */
  close(): void {
    this.wakeups.close();
  }

  /** Removes all the key's entries of `id`, whichever it has (a place while waiting, a lease and an estimated end while running). */
  private async forget(keys: ReturnType<typeof keysOf>, id: string): Promise<void> {
    // A failure is said (once, as any), and tried again once Redis is back (see unreleased). A success
    // says nothing, as it follows a failed take that Redis may still fail.
    await this.redis.imagegenForgetSlot(keys.waiting, keys.places, keys.slots, keys.ends, id).then(
      () => this.unreleased.delete(id),
      (err: unknown) => {
        this.status.failed(err);
        // Tried again and failed again: it keeps its place, and the time its entries run out by.
        if (!this.unreleased.has(id)) this.unreleased.set(id, { keys, at: performance.now() });
        for (const [old, { at }] of this.unreleased) {
          if (performance.now() - at <= this.leaseMs) break;
          this.unreleased.delete(old);
        }
      },
    );
    // A slot freed, or a place in line: the key's waiting requests ask again.
    this.wakeups.notify(keys.freed);
  }

  /** Seconds until the first of the key's running requests is estimated to end; at least 1 (also when Redis cannot say). */
  private async retryAfter(keys: ReturnType<typeof keysOf>): Promise<number> {
    const firstMs = await this.redis.imagegenFirstEnd(keys.ends).catch(() => -1);
    return firstMs < 0 ? 1 : Math.max(1, Math.ceil(firstMs / 1000));
  }
}
