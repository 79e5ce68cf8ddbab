import { randomBytes } from 'node:crypto';
import type { Redis, Result } from 'ioredis';
import type { Logger } from 'pino';
import { MemoryLedger, type RateLedger, type Spending, type Spent, type WindowLimits } from './key-rates.js';
import { RedisFallback } from './redis.js';

/**
 * Per-key rates kept in Redis, so that replicas share them: each key's last minute is a sorted set of
 * `<at>:<images>:<nonce>` scored by `at`, checked, appended and read back in one Lua script (Redis runs a script
 * alone, so two replicas can never both admit the last request that fits). The script applies
 * key-rates.ts's fits() rule. Times are the replicas' own clocks: keep them in sync (NTP).
 *
 * While Redis cannot be reached, each replica counts in its own memory (a key may then get up to its
 * limit from each replica) rather than refusing or stalling every request; the log says when it falls
 * back and when it is back.
 */

const SPEND = `
local at = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', at - tonumber(ARGV[2]))
local recent = redis.call('ZRANGE', KEYS[1], 0, -1)
local images = 0
for _, member in ipairs(recent) do
  images = images + tonumber(string.match(member, '^[^:]+:(%d+):'))
end
local maxRequests, maxImages = tonumber(ARGV[4]), tonumber(ARGV[5])
local fits = not ((maxRequests >= 0 and #recent + 1 > maxRequests) or (maxImages >= 0 and images + tonumber(ARGV[3]) > maxImages))
if fits and ARGV[7] == '1' then
  redis.call('ZADD', KEYS[1], at, ARGV[6])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
local answer = { fits and 1 or 0 }
for _, member in ipairs(recent) do
  answer[#answer + 1] = member
end
return answer
`;

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** Defined by RedisLedger: 1 when `entry` fits (then recorded, if `record`), else 0, followed by the members of the window before it. */
    imagegenSpend(key: string, at: number, windowMs: number, images: number, maxRequests: number, maxImages: number, member: string, record: 0 | 1): Result<[number, ...string[]], Context>;
  }
}

const KEY_PREFIX = 'imagegen:rate:';

export class RedisLedger implements RateLedger {
  private readonly fallback = new MemoryLedger();
  private readonly status: RedisFallback;

  constructor(
    private readonly redis: Redis,
    logger: Logger,
  ) {
    redis.defineCommand('imagegenSpend', { numberOfKeys: 1, lua: SPEND });
    this.status = new RedisFallback(logger, 'per-key rates are counted per server until it can', 'per-key rates are shared again');
  }

  async spend(label: string, entry: Spent, limits: WindowLimits, windowMs: number, record = true): Promise<Spending> {
    const member = `${entry.at}:${entry.images}:${randomBytes(6).toString('hex')}`;
    let answer: [number, ...string[]];
    try {
      answer = await this.redis.imagegenSpend(`${KEY_PREFIX}${label}`, entry.at, windowMs, entry.images, limits.requests ?? -1, limits.images ?? -1, member, record ? 1 : 0);
    } catch (err) {
      this.status.failed(err);
      return this.fallback.spend(label, entry, limits, windowMs, record);
    }
    this.status.answered();
    const [fits, ...members] = answer;
    return { fits: fits === 1, recent: members.map((m) => ({ at: Number(m.split(':')[0]), images: Number(m.split(':')[1]) })) };
  }
}
