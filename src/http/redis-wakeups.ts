import type { Redis } from 'ioredis';

/**
 * Wake-ups over Redis pub/sub: a replica whose request waits for something another replica frees (a
 * key's slot, key-slots.ts) listens on a channel, and whichever replica frees it publishes there, so the
 * wait ends at once instead of at the next poll. A hint only: a message lost (Redis restarting, the
 * subscription not made yet) costs at most one poll, which the waiters keep doing. The subscription
 * needs a connection of its own (a subscribed connection can do nothing else), made the first time a
 * request waits, with the shared connection's options.
 */
export class RedisWakeups {
  private subscriber?: Redis;
  private connecting?: Promise<void>;
  private readonly listeners = new Map<string, Set<() => void>>();

  constructor(private readonly redis: Redis) {}

  /**
   * Calls `wake` whenever `channel` is published to, until the returned function is called. Resolves
   * once the subscription is made, or after `withinMs` if Redis is slow to make it (the listener stays).
   */
  async listen(channel: string, wake: () => void, withinMs: number): Promise<() => void> {
    const listeners = this.listeners.get(channel) ?? new Set();
    const first = listeners.size === 0;
    listeners.add(wake);
    this.listeners.set(channel, listeners);
    const stop = () => {
      listeners.delete(wake);
      if (listeners.size > 0 || this.listeners.get(channel) !== listeners) return;
      this.listeners.delete(channel);
      this.subscriber?.unsubscribe(channel).catch(() => undefined);
    };
    if (first) {
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<void>((resolve) => (timer = setTimeout(resolve, withinMs)));
      await Promise.race([this.subscribed(channel), late]);
      clearTimeout(timer);
    }
    return stop;
  }

  /** Wakes the listeners of `channel` on every replica. Errors are ignored: the waiters poll. */
  notify(channel: string): void {
    this.redis.publish(channel, '').catch(() => undefined);
  }

  close(): void {
    this.subscriber?.disconnect();
  }

  /** Subscribes to `channel`, connecting first if need be (the shared connection's options queue nothing before that). */
  private async subscribed(channel: string): Promise<void> {
    if (!this.subscriber) {
      this.subscriber = this.redis.duplicate();
      // As for the shared connection (redis.ts): its users say what a failure costs them.
      this.subscriber.on('error', () => undefined);
      this.subscriber.on('message', (channel: string) => {
        for (const wake of this.listeners.get(channel) ?? []) wake();
      });
      this.connecting = this.subscriber.connect().catch(() => undefined);
    }
    await this.connecting;
    // Reconnections subscribe again by themselves (ioredis's autoResubscribe).
    await this.subscriber.subscribe(channel).catch(() => undefined);
  }
}

/** A wake-up that may come before it is waited for: `wait` then returns at once. */
export class Wakeup {
  private pending = false;
  private resume?: () => void;

  readonly wake = (): void => {
    this.pending = true;
    this.resume?.();
  };

  /** Resolves when woken (or at once if woken since the last wait), after `ms` at most; rejects with `signal`'s reason when it aborts. */
  wait(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      const done = (settle: () => void) => () => {
        clearTimeout(timer);
        signal.removeEventListener('abort', aborted);
        this.resume = undefined;
        this.pending = false;
        settle();
      };
      const aborted = done(() => reject(signal.reason));
      const timer = setTimeout(done(resolve), this.pending ? 0 : ms);
      this.resume = done(resolve);
      if (signal.aborted) return aborted();
      signal.addEventListener('abort', aborted, { once: true });
    });
  }
}
