import type { Redis } from 'ioredis';
import { afterAll, beforeAll } from 'vitest';
import { connectRedis } from '../../src/http/redis.js';
import { silentLogger } from './logs.js';
import { findCommand, startRedis, type RedisService } from './services.js';

/** redis-server, if installed: the tests that need it skip without it, saying so in their title (NO_REDIS). */
export const REDIS_SERVER = findCommand('redis-server');
export const NO_REDIS = REDIS_SERVER ? '' : ' (skipped: redis-server not found, install it with apt-get install redis-server)';
if (!REDIS_SERVER) console.warn(`tests of limits shared through Redis${NO_REDIS}`);

/** The Redis of a describe (see useRedis). */
export interface TestRedis {
  readonly url: string;
  /** A connection as a replica has one (REDIS_URL), closed after the describe's tests. */
  connect(): Promise<Redis>;
  /** Stops the server now (a test of Redis going away); the describe's end then stops nothing more. */
  stop(): Promise<void>;
  /** Sends the server a signal: SIGSTOP stalls it (connections open, nothing answered), SIGCONT resumes it. */
  signal(signal: NodeJS.Signals): void;
}

/** A throw-away redis-server for the describe this is called in, started before its tests and stopped after them. */
export function useRedis(): TestRedis {
  let service: RedisService | undefined;
  const connections: Redis[] = [];
  beforeAll(async () => {
    service = await startRedis(REDIS_SERVER!);
  });
  afterAll(async () => {
    for (const connection of connections) connection.disconnect();
    await service?.stop();
  });
  return {
    get url() {
      return service!.url;
    },
    async connect() {
      const connection = await connectRedis(service!.url, silentLogger);
      connections.push(connection);
      return connection;
    },
    stop: () => service!.stop(),
    signal: (signal) => void service!.child.kill(signal),
  };
}
