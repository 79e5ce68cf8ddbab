import { randomBytes } from 'node:crypto';
import type { Redis, Result } from 'ioredis';
import type { Logger } from 'pino';
import { MemoryLedger, type RateLedger, type Spending, type WindowLimits } from './key-rates.js';
import { RedisFallback } from './redis.js';

/**
 * Per-key rates kept in Redis, so that replicas share them: each key's last minute is a sorted set of
 * `<at>:<images>:<nonce>` scored by `at`, checked, appended and read back in one Lua script (Redis runs a script
 * alone, so two replicas can never both admit the last request that fits). The script applies
 * key-rates.ts's fits() rule. `at` is Redis's own clock (TIME, read in the script), so replicas whose
 * clocks disagree still share one window; tests give a clock of their own to move.
 *
 * While Redis cannot be reached, each replica counts in its own memory (a key may then get up to its
 * limit from each replica) rather than refusing or stalling every request; the log says when it falls
 * back and when it is back.
 */

const SPEND = `
local at = tonumber(ARGV[1])
if at < 0 then
  -- Before Redis 5 a script that reads the clock may write only once it replicates its effects (later ones always do).
  if redis.replicate_commands then redis.replicate_commands() end
  local time = redis.call('TIME')
  at = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
-- Every digit of a time in milliseconds (Lua's own conversion keeps 14).
local stamp = string.format('%.17g', at)
-- Entries after now were counted before Redis's clock stepped back (NTP, a VM resumed): left there, they
-- held their key to its limit for as long as the step (a day's step, a day of 429s with a Retry-After of a
-- day). Counted again as of now, they still count, and leave the window a minute on.
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. stamp, '+inf')) do
  redis.call('ZREM', KEYS[1], member)
  redis.call('ZADD', KEYS[1], at, stamp .. string.match(member, '^[^:]+(:.*)$'))
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', at - tonumber(ARGV[2]))
local recent = redis.call('ZRANGE', KEYS[1], 0, -1)
local images = 0
for _, member in ipairs(recent) do
  images = images + tonumber(string.match(member, '^[^:]+:(%d+):'))
end
local maxRequests, maxImages = tonumber(ARGV[4]), tonumber(ARGV[5])
local fits = not ((maxRequests >= 0 and #recent + 1 > maxRequests) or (maxImages >= 0 and images + tonumber(ARGV[3]) > maxImages))
if fits and ARGV[7] == '1' then
  redis.call('ZADD', KEYS[1], at, stamp .. ':' .. ARGV[3] .. ':' .. ARGV[6])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
local answer = { fits and 1 or 0, stamp }
for _, member in ipairs(recent) do
  answer[#answer + 1] = member
end
return answer
`;

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /**
     * Defined by RedisLedger: 1 when an entry of `images` at `at` (Redis's time where -1) fits (then
     * recorded, if `record`), else 0; then the time it was counted at, and the members of the window before it.
     */
    imagegenSpend(key: string, at: number, windowMs: number, images: number, maxRequests: number, maxImages: number, nonce: string, record: 0 | 1): Result<[number, string, ...string[]], Context>;
  }
}

const KEY_PREFIX = 'imagegen:rate:';

export class RedisLedger implements RateLedger {
  private readonly fallback: MemoryLedger;
  private readonly status: RedisFallback;

  /** `now`: a clock in place of Redis's (tests move one); this machine's times the fallback. */
  constructor(
    private readonly redis: Redis,
    logger: Logger,
    private readonly now?: () => number,
  ) {
    redis.defineCommand('imagegenSpend', { numberOfKeys: 1, lua: SPEND });
    this.fallback = new MemoryLedger(now);
    this.status = new RedisFallback(redis, logger, 'per-key rates are counted per server until it answers again', 'per-key rates are shared again');
  }

  async spend(label: string, images: number, limits: WindowLimits, windowMs: number, record = true): Promise<Spending> {
    if (!this.status.shouldAsk()) return this.fallback.spend(label, images, limits, windowMs, record);
    let answer: [number, string, ...string[]];
    try {
      const at = this.now?.() ?? -1;
      answer = await this.redis.imagegenSpend(`${KEY_PREFIX}${label}`, at, windowMs, images, limits.requests ?? -1, limits.images ?? -1, randomBytes(6).toString('hex'), record ? 1 : 0);
    } catch (err) {
      this.status.failed(err);
      return this.fallback.spend(label, images, limits, windowMs, record);
    }
    this.status.answered();
    const [fits, at, ...members] = answer;
    return { fits: fits === 1, at: Number(at), recent: members.map((m) => ({ at: Number(m.split(':')[0]), images: Number(m.split(':')[1]) })) };
  }
}
