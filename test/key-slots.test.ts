import { once } from 'node:events';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { connect, createServer, type AddressInfo, type Socket } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Redis } from 'ioredis';
import type OpenAI from 'openai';
import { describe, expect, it, onTestFinished, vi } from 'vitest';
import type { ApiError } from '../src/api/errors.js';
import { KeySlots, type KeySlotsOptions } from '../src/http/key-slots.js';
import { connectRedis } from '../src/http/redis.js';
import { holdNextBatch } from './helpers/busy-worker.js';
import { failureOf } from './helpers/failures.js';
import { silentLogger } from './helpers/logs.js';
import { startRealServer } from './helpers/real-server.js';
import { NO_REDIS, REDIS_SERVER, useRedis, type TestRedis } from './helpers/redis.js';
import { startRedis } from './helpers/services.js';

/**
 * A key's `concurrent` limit over replicas, kept in a real Redis: each replica's KeySlots has its own
 * connection, and together they never run more of the key's requests than the limit; a replica that
 * dies holding slots frees them when their leases run out. Two real servers sharing the Redis show it
 * over HTTP.
 */

let redis: TestRedis;

async function replica(options: KeySlotsOptions = {}): Promise<{ slots: KeySlots; connection: Redis }> {
  const connection = await redis.connect();
  const slots = new KeySlots(connection, silentLogger, { pollMs: 20, ...options });
  // Its wake-ups' own connection, if a request waited.
  onTestFinished(() => slots.close());
  return { slots, connection };
}

/** Work that runs until `finish` is called, recording that it ran. */
function pending() {
  let finish!: () => void;
  const done = new Promise<void>((resolve) => (finish = resolve));
  const state = { running: false, finish };
  return { state, work: async () => ((state.running = true), await done) };
}

const never = new AbortController().signal;
/**
 * A moment for what should not happen (a request past the limit starting, a second wait said) to show:
 * what must happen is waited for (untilRunning, untilWaiting), as a loaded machine takes its time for it.
 */
const tick = () => new Promise((resolve) => setTimeout(resolve, 100));

/*
 * The polls below wait as long as vitest.config.ts lets any (30 s): what they wait for (a lease run out,
 * a wake-up, a renewal) comes within a second, a stall of a loaded machine's Redis or event loop can
 * take seconds, and a shorter limit told nothing more of the code.
 */

/** Until `work` runs: its replica's take went through Redis, however long that took. */
const untilRunning = (state: { running: boolean }) => expect.poll(() => state.running, { interval: 20 }).toBe(true);

/** Until `count` requests wait in Redis for `label`'s slots: each asked (in the order awaited) and found none free. */
const untilWaiting = (connection: Redis, label: string, count: number) => expect.poll(() => connection.zcard(`imagegen:slots:${label}:waiting`)).toBe(count);

const DAY_MS = 86_400_000;

/**
 * The network between a replica and `target` (a Redis's port), as a TCP relay on a port of its own:
 * cut() drops its connections and refuses new ones (a blip of the network), mend() lets them through again.
 */
async function network(target: number) {
  const sockets = new Set<Socket>();
  const relay = createServer((client) => {
    const upstream = connect(target, '127.0.0.1');
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on('error', () => undefined).on('close', () => sockets.delete(socket));
    }
    client.pipe(upstream).pipe(client);
  });
  await once(relay.listen(0, '127.0.0.1'), 'listening');
  const port = (relay.address() as AddressInfo).port;
  const cut = () => {
    relay.close();
    for (const socket of sockets) socket.destroy();
  };
  return { url: `redis://127.0.0.1:${port}/0`, cut, mend: async () => void (await once(relay.listen(port, '127.0.0.1'), 'listening')) };
}

/**
 * Leaves a key's times in Redis as a step back of Redis's clock by `ms` would (NTP, a VM resumed): each
 * lease's end, place's expiry, arrival and estimated end that far ahead of Redis's time.
 */
async function redisClockStepsBack(connection: Redis, label: string, ms: number): Promise<void> {
  const slots = `imagegen:slots:${label}`;
  for (const set of [slots, `${slots}:waiting`, `${slots}:places`]) {
    const scored = await connection.zrange(set, '0', '-1', 'WITHSCORES');
    for (let i = 0; i < scored.length; i += 2) await connection.zadd(set, Number(scored[i + 1]) + ms, scored[i]);
  }
  for (const [id, end] of Object.entries(await connection.hgetall(`${slots}:ends`))) await connection.hset(`${slots}:ends`, id, String(Number(end) + ms));
}

/**
 * The lease of the tests whose running request must keep its slot while a waiting one asks: those
 * replicas run in this process, and a stall of it (a collection, other test files' onnxruntime threads
 * on a loaded machine's cores; this file has seen 2.5 s) held back the renewals, which come every second
 * at most, while the lease ran out in Redis. On resuming, a waiter's poll could fire before the renewal
 * and take the slot: two requests of a concurrent=1 key ran (with 0.6 and 1 s leases, so here with a
 * 2.5 s busy loop in the test). A renewed lease of 5 s outlives a stall of 4.
 */
const LEASE_MS = 5000;

/**
 * A replica takes `label`'s one slot and dies (no renewal, no release), `meanwhile` runs, then another
 * asks for the key: its request, which waits for the slot, the hold it waits in, and the dead one's work.
 * Leases of LEASE_MS: the survivor's first tries, 100 ms after the death, come within the last one the
 * dying replica renewed though this process stalls (300 ms failed on a busy machine, 1 s with a 2.5 s
 * stall), and it then waits the rest of that lease out. The survivor's is as long: a take clamps the
 * leases in Redis to its own from now (see TAKE), which would free a longer one early.
 */
async function afterReplicaDied(label: string, meanwhile: (survivor: Redis) => Promise<void> = async () => undefined) {
  const dying = await replica({ leaseMs: LEASE_MS });
  const survivor = await replica({ leaseMs: LEASE_MS });
  const key = { label, limits: { concurrent: 1 } };
  const stuck = pending();
  void dying.slots.hold(key, never, stuck.work);
  await untilRunning(stuck.state);
  dying.connection.disconnect();
  await meanwhile(survivor.connection);
  const next = pending();
  return { next, waiting: survivor.slots.hold(key, never, next.work), stuck };
}

/** Ms from Redis's time now to the estimated end of `label`'s one running request. */
async function msToEstimatedEnd(connection: Redis, label: string): Promise<number> {
  const [end] = Object.values(await connection.hgetall(`imagegen:slots:${label}:ends`));
  const [seconds, micros] = await connection.time();
  return Number(end) - (Number(seconds) * 1000 + Math.floor(Number(micros) / 1000));
}

describe.skipIf(!REDIS_SERVER)(`'concurrent' slots shared through Redis${NO_REDIS}`, () => {
  redis = useRedis();

  it('runs at most the limit of a key over all replicas; a waiting request starts when one ends', async () => {
    const [one, two] = [await replica(), await replica()];
    const key = { label: 'alice', limits: { concurrent: 2 } };
    const works = [pending(), pending(), pending()];
    const held = [one.slots.hold(key, never, works[0].work), two.slots.hold(key, never, works[1].work), one.slots.hold(key, never, works[2].work)];
    // Which two get the slots is a race between the replicas; that only two do is not.
    const running = () => works.filter((p) => p.state.running);
    await expect.poll(() => running().length).toBe(2);
    await untilWaiting(one.connection, 'alice', 1);
    await tick();
    expect(running()).toHaveLength(2);
    const waiting = works.find((p) => !p.state.running)!;
    // Another key has its own slots.
    const other = pending();
    const otherHeld = two.slots.hold({ label: 'bob', limits: { concurrent: 1 } }, never, other.work);
    await untilRunning(other.state);
    running()[0].state.finish();
    await untilRunning(waiting.state);
    for (const p of [...works, other]) p.state.finish();
    await Promise.all([...held, otherHeld]);
  });

  it('starts a waiting request as soon as the running one ends on another replica, not at its next poll', async () => {
    // Polls a minute apart: only the wake-up the ending replica publishes can start the waiting request
    // within the 10 s allowed. (Polls 5 s apart allowed 1 s: a loaded machine's stalls, not the code, could
    // pass that; polls a minute apart let the bound be ten times wider and still tell a wake-up from a poll.)
    const [one, two] = [await replica({ pollMs: 60_000 }), await replica({ pollMs: 60_000 })];
    const key = { label: 'kate', limits: { concurrent: 1 } };
    const first = pending();
    const held = one.slots.hold(key, never, first.work);
    await untilRunning(first.state);
    const second = pending();
    const waiting = two.slots.hold(key, never, second.work);
    await untilWaiting(one.connection, 'kate', 1);
    // Listening for the wake-up (then it asks once more, and waits).
    await expect.poll(async () => (await one.connection.pubsub('NUMSUB', 'imagegen:slots:kate:freed'))[1]).toBe(1);
    await tick();
    expect(second.state.running).toBe(false);
    const ended = performance.now();
    first.state.finish();
    await untilRunning(second.state);
    expect(performance.now() - ended).toBeLessThan(10_000);
    second.state.finish();
    await Promise.all([held, waiting]);
  });

  it("frees a dead replica's slots when their leases run out", async () => {
    const { next, waiting, stuck } = await afterReplicaDied('carol');
    await tick();
    expect(next.state.running).toBe(false);
    await untilRunning(next.state);
    next.state.finish();
    await waiting;
    stuck.state.finish();
  });

  it('leaves no lease, nor its estimated end, behind when taking a slot timed out on a stalled Redis that later resumes', async () => {
    const { slots, connection } = await replica();
    const key = { label: 'erin', limits: { concurrent: 1 } };
    redis.signal('SIGSTOP');
    try {
      // The take times out (1 s): the work runs unshared, as while Redis is down.
      expect(await slots.hold(key, never, async () => 'ran')).toBe('ran');
    } finally {
      redis.signal('SIGCONT');
    }
    // Redis then runs the take it had received, and the removal sent after it.
    await expect.poll(() => connection.zcard('imagegen:slots:erin'), { interval: 50 }).toBe(0);
    await tick();
    expect(await connection.zcard('imagegen:slots:erin')).toBe(0);
    // Nor its estimated end, which would be every later wait's Retry-After.
    expect(await connection.hlen('imagegen:slots:erin:ends')).toBe(0);
  });

  it('leaves no lease of a finished request in a Redis restarted after it stalled: the renewals it never answered are not sent again to the new one', async () => {
    // A Redis of its own, killed and started again where the replica looks.
    let own = await startRedis(REDIS_SERVER!);
    onTestFinished(() => own.stop());
    const connection = await connectRedis(own.url, silentLogger);
    onTestFinished(() => connection.disconnect());
    const slots = new KeySlots(connection, silentLogger, { pollMs: 20 });
    onTestFinished(() => slots.close());
    const key = { label: 'nora', limits: { concurrent: 1 } };
    const running = pending();
    const held = slots.hold(key, never, running.work);
    await untilRunning(running.state);
    // Stalled, it takes the renewals (every second) and answers none; then it is killed.
    own.child.kill('SIGSTOP');
    await new Promise((resolve) => setTimeout(resolve, 2500));
    const killed = once(own.child, 'exit');
    own.child.kill('SIGKILL');
    await killed;
    // The request ends while Redis is down: its release fails, as Redis has nothing to release.
    running.state.finish();
    await held;
    own = await startRedis(REDIS_SERVER!, Number(new URL(own.url).port));
    await expect.poll(() => connection.ping().catch(() => 'not yet'), { interval: 50 }).toBe('PONG');
    await tick();
    // The client sent its unanswered renewals again to the new Redis, which put back the finished
    // request's lease: the key's one slot was taken for 30 s by nobody.
    expect(await connection.zcard('imagegen:slots:nora')).toBe(0);
  });

  it("frees the slot of a request that ended while the replica's connection to Redis was down, once it is back, not when its lease runs out", async () => {
    const link = await network(Number(new URL(redis.url).port));
    onTestFinished(link.cut);
    const connection = await connectRedis(link.url, silentLogger);
    onTestFinished(() => connection.disconnect());
    const slots = new KeySlots(connection, silentLogger, { pollMs: 20 });
    onTestFinished(() => slots.close());
    const other = await replica();
    const key = { label: 'olga', limits: { concurrent: 1 } };
    const running = pending();
    const held = slots.hold(key, never, running.work);
    await untilRunning(running.state);
    link.cut();
    running.state.finish();
    await held;
    await link.mend();
    // Another replica's request of the key runs once the connection is back (within a second of
    // ioredis's reconnecting), not 30 s later when the lease of the one that ended would have run out.
    const started = performance.now();
    expect(await other.slots.hold(key, never, async () => 'next')).toBe('next');
    expect(performance.now() - started).toBeLessThan(10_000);
    expect(await other.connection.zcard('imagegen:slots:olga')).toBe(0);
  });

  it('frees the slot of a finished request while Redis refuses writes for want of memory (maxmemory reached, noeviction)', async () => {
    const { slots, connection } = await replica();
    const key = { label: 'kate', limits: { concurrent: 1 } };
    await connection.config('SET', 'maxmemory-policy', 'noeviction');
    await connection.config('SET', 'maxmemory', '1');
    try {
      expect(await slots.hold(key, never, async () => 'first')).toBe('first');
      // Deletions still run: the slot is free for the next request at once, not when its lease (30 s) runs out.
      expect(await connection.zcard('imagegen:slots:kate')).toBe(0);
      const started = performance.now();
      expect(await slots.hold(key, never, async () => 'second')).toBe('second');
      // Well within the 30 s a left lease would hold the slot (1 s was tight for a loaded machine's few Redis round trips).
      expect(performance.now() - started).toBeLessThan(10_000);
    } finally {
      await connection.config('SET', 'maxmemory', '0');
    }
  });

  it('says once when a request begins to wait for a slot, and not when it gets one at once', async () => {
    const { slots } = await replica();
    const key = { label: 'gina', limits: { concurrent: 1 } };
    const first = pending();
    const waits: string[] = [];
    const held = slots.hold(key, never, first.work, () => waits.push('first'));
    await untilRunning(first.state);
    const second = slots.hold(key, never, async () => 'ran', () => waits.push('second'));
    await expect.poll(() => waits).toEqual(['second']);
    // Several polls (20 ms each) while it waits: told once.
    await tick();
    await tick();
    expect(waits).toEqual(['second']);
    first.state.finish();
    expect(await second).toBe('ran');
    await held;
    expect(waits).toEqual(['second']);
  });

  it('answers 503 queue_timeout after the longest wait, and ends a waiting request whose client left with its reason', async () => {
    const { slots, connection } = await replica({ maxWaitMs: 200 });
    const key = { label: 'dave', limits: { concurrent: 1 } };
    const first = pending();
    const held = slots.hold(key, never, first.work);
    await untilRunning(first.state);
    await expect(slots.hold(key, never, async () => undefined)).rejects.toMatchObject({ status: 503, code: 'queue_timeout', headers: { 'retry-after': '1' } });
    // It left its place as it gave up (removed before the 503, on the same connection): kept until it
    // lapsed, the place stood first in line, and a slot freed meanwhile went to none of those after it.
    expect(await connection.zcard('imagegen:slots:dave:waiting')).toBe(0);
    // What the request waited before (for room for its answer) counts: one that waited all of it already gets its 503 at once.
    const { slots: longer } = await replica({ maxWaitMs: 60_000 });
    const started = performance.now();
    await expect(longer.hold(key, never, async () => undefined, () => 60_000)).rejects.toMatchObject({ status: 503, code: 'queue_timeout', message: expect.stringMatching(/this request waited 60s for one to end/) });
    expect(performance.now() - started).toBeLessThan(30_000);
    // On a replica without a longest wait: the 200 ms above passed, on a loaded machine, while the
    // request asked Redis twice and subscribed, and it got that 503 before its client's leaving was seen.
    const { slots: patient } = await replica();
    const leaving = new AbortController();
    const waiting = patient.hold(key, leaving.signal, async () => undefined);
    leaving.abort(new Error('client left'));
    await expect(waiting).rejects.toThrow('client left');
    first.state.finish();
    await held;
  });

  it("gives freed slots to the key's waiting requests in the order they came, over all replicas", async () => {
    // Polls a second apart, not this file's 20 ms: a waiter's place lapses after ten polls missed, and
    // with four test files on 2 cores a waiter went 200 ms without polling, so the one after it was next.
    // The default 200 ms kept places 2 s, which a loaded machine's stall can pass too; the waiters start
    // on the wake-ups that each end publishes, not on their polls.
    const [one, two] = [await replica({ pollMs: 1000 }), await replica({ pollMs: 1000 })];
    const key = { label: 'hana', limits: { concurrent: 1 } };
    const first = pending();
    const held = [one.slots.hold(key, never, first.work)];
    await untilRunning(first.state);
    // Four more come in turn, alternating replicas; each then polls on its own timer.
    const started: number[] = [];
    const rest = [0, 1, 2, 3].map(() => pending());
    for (const [i, p] of rest.entries()) {
      held.push((i % 2 ? two : one).slots.hold(key, never, async () => (started.push(i), p.work())));
      await untilWaiting(one.connection, 'hana', i + 1);
      // Redis's clock in whole ms says when each came: two that ask within one ms tie, in no set order.
      await tick();
    }
    first.state.finish();
    for (const [i, p] of rest.entries()) {
      await expect.poll(() => started, { interval: 10 }).toEqual([0, 1, 2, 3].slice(0, i + 1));
      await tick();
      expect(started).toHaveLength(i + 1);
      p.state.finish();
    }
    await Promise.all(held);
  });

  it("keeps leases and order on Redis's clock: replicas whose clocks are off by an hour neither expire a running lease nor jump the queue", async () => {
    // Polls a second apart, as in the order test above: at this file's 20 ms a waiter's place lapses after
    // 200 ms without a poll, which a loaded machine's stall passed (the full suite on 2 cores, helpers
    // beside it): the second request lost its place, the third took the slot first, and this waited for
    // the second for good. The waiters start on the wake-ups that each end publishes. Leases of LEASE_MS:
    // besides outliving a stall, the key's sets live two leases past its last ask (see TAKE), so with 1 s
    // leases a stall of 2 s expired the set of waiting requests (asking a second apart), and their order.
    const [one, two, three] = [await replica({ leaseMs: LEASE_MS, pollMs: 1000 }), await replica({ leaseMs: LEASE_MS, pollMs: 1000 }), await replica({ leaseMs: LEASE_MS, pollMs: 1000 })];
    const key = { label: 'jun', limits: { concurrent: 1 } };
    const [running, fast, slow] = [pending(), pending(), pending()];
    const held = [one.slots.hold(key, never, running.work)];
    await untilRunning(running.state);
    // This process's clock is every replica's: an hour fast while the second request comes, an hour slow for the third.
    const realNow = Date.now.bind(Date);
    const clock = vi.spyOn(Date, 'now');
    try {
      clock.mockImplementation(() => realNow() + 3_600_000);
      held.push(two.slots.hold(key, never, fast.work));
      await untilWaiting(one.connection, 'jun', 1);
      // Redis's clock in whole ms says when each came, as in the order test above: the third asking within
      // the ms the second came in tied with it, and its id could rank it first (it took the slot, and this
      // waited for the second for good). Only a clock that jumped the queue may put it first.
      await tick();
      clock.mockImplementation(() => realNow() - 3_600_000);
      held.push(three.slots.hold(key, never, slow.work));
      await untilWaiting(one.connection, 'jun', 2);
      expect([running.state.running, fast.state.running, slow.state.running]).toEqual([true, false, false]);
      running.state.finish();
      await untilRunning(fast.state);
      await tick();
      expect(slow.state.running).toBe(false);
      fast.state.finish();
      await untilRunning(slow.state);
      slow.state.finish();
      await Promise.all(held);
    } finally {
      clock.mockRestore();
    }
  });

  it('puts back the lease of a running request that Redis lost (a restart without persistence), so the limit holds again', async () => {
    // The running one's lease is the default (30 s), renewed every second all the same (RENEW_MS), not
    // every third of it: the lease Redis lost is back within a second, not ten. The waiting one's take
    // clamps it to LEASE_MS (see TAKE), which the renewals outlast as in the tests above.
    const [one, two] = [await replica(), await replica({ leaseMs: LEASE_MS })];
    const key = { label: 'ivan', limits: { concurrent: 1 } };
    const running = pending();
    const held = one.slots.hold(key, never, running.work);
    await untilRunning(running.state);
    await one.connection.flushall();
    // Within 8 s: a second and what a loaded machine's stall takes (2.5 s seen), short of the ten.
    await expect.poll(() => one.connection.zcard('imagegen:slots:ivan'), { interval: 20, timeout: 8000 }).toBe(1);
    const next = pending();
    const waiting = two.slots.hold(key, never, next.work);
    await untilWaiting(one.connection, 'ivan', 1);
    await tick();
    expect(next.state.running).toBe(false);
    running.state.finish();
    await held;
    await untilRunning(next.state);
    next.state.finish();
    await waiting;
  });

  it("answers a timed-out wait with a Retry-After from when the key's running request was estimated to end", async () => {
    const { slots } = await replica({ maxWaitMs: 200 });
    const key = { label: 'jude', limits: { concurrent: 1 } };
    const first = pending();
    const asked = performance.now();
    const held = slots.hold(key, never, first.work, undefined, 30);
    await untilRunning(first.state);
    const refused = await slots.hold(key, never, async () => undefined).then(
      () => expect.fail('the wait was not refused'),
      (e: unknown) => e as ApiError,
    );
    const elapsedMs = performance.now() - asked;
    expect(refused).toMatchObject({ status: 503, code: 'queue_timeout' });
    // The 30 s less what passed since the first request took its slot: under a second here, more on a
    // loaded machine (a bound of 29 held only within two).
    expect(Number(refused.headers['retry-after'])).toBeGreaterThanOrEqual(30 - Math.ceil(elapsedMs / 1000));
    expect(Number(refused.headers['retry-after'])).toBeLessThanOrEqual(30);
    expect(refused.message).toMatch(new RegExp(`try again in ${refused.headers['retry-after']}s`));
    first.state.finish();
    await held;
  });

  it("answers a timed-out wait with a Retry-After from the running request's estimate, not from a step back of Redis's clock", async () => {
    const { slots, connection } = await replica({ maxWaitMs: 200 });
    const key = { label: 'kim', limits: { concurrent: 1 } };
    const first = pending();
    const held = slots.hold(key, never, first.work, undefined, 30);
    await untilRunning(first.state);
    await redisClockStepsBack(connection, 'kim', DAY_MS);
    // Until a renewal of the running request's lease (every second) sets its estimated end anew. (The
    // wait of 1.5 s, in which one came, left its order to this process's timers: a loaded machine's
    // event loop could hear the refused request's last poll before a renewal it was late for.)
    await expect.poll(() => msToEstimatedEnd(connection, 'kim')).toBeLessThanOrEqual(30_000);
    const refused = await failureOf<ApiError>(slots.hold(key, never, async () => undefined));
    expect(refused).toMatchObject({ status: 503, code: 'queue_timeout' });
    expect(Number(refused.headers['retry-after'])).toBeLessThanOrEqual(30);
    first.state.finish();
    await held;
  });

  it("frees a dead replica's slot when its lease runs out, though Redis's clock stepped back a day after its last renewal", async () => {
    const { next, waiting, stuck } = await afterReplicaDied('lena', (survivor) => redisClockStepsBack(survivor, 'lena', DAY_MS));
    await untilRunning(next.state);
    next.state.finish();
    await waiting;
    stuck.state.finish();
  });

  it('holds over HTTP: a key with concurrent=1 waits on one server while it runs on another', async () => {
    const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-slots-'));
    const keys = path.join(root, 'keys');
    await writeFile(keys, 'frank:sk-frank-0123456789 concurrent=1\n');
    const env = { REDIS_URL: redis.url, API_KEYS_FILE: keys, WORKERS: '1', QUEUE_MAX: '2' };
    const [one, two] = [await startRealServer({ env, apiKey: 'sk-frank-0123456789' }), await startRealServer({ env, apiKey: 'sk-frank-0123456789' })];
    try {
      await expect.poll(() => one.server.engine.readiness().ready && two.server.engine.readiness().ready, { timeout: 60_000 }).toBe(true);
      const order: string[] = [];
      // The long request held (SIGSTOP) before its worker begins it, its key's slot taken, until the
      // third is refused: however slow the machine's round trips below, it cannot end first ('long' and
      // 'short' answered, and no full queue). Held before it begins, it need not be long to outlast them:
      // at 256x256 it is a sixteenth of the work of the 1024x1024 caught midway it was.
      const { sent: long, resume } = await holdNextBatch(one.server.engine, () =>
        one.client.images
          .generate({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256', response_format: 'b64_json', steps: 60 } as OpenAI.ImageGenerateParamsNonStreaming)
          .then(() => order.push('long')),
      );
      const { short, reader } = await (async () => {
        const short = two.client.images.generate({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256', response_format: 'b64_json' }).then(() => order.push('short'));
        // Waiting for the slot before the streamed one comes, so that the two fill the queue below.
        await untilWaiting(await redis.connect(), 'frank', 1);
        // Its server is idle, yet the request waits for the key's one slot.
        expect(two.server.engine.load()).toEqual({ running: 0, queued: 0 });
        // A streamed request of the key opens its stream as it begins to wait (a proxy or a client waiting
        // for a first byte would give up on a silent one), and its events come once it ran.
        const streamed = await fetch(`${two.server.url}/v1/images/generations`, {
          method: 'POST',
          headers: { authorization: 'Bearer sk-frank-0123456789', 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256', stream: true }),
        });
        const reader = streamed.body!.getReader();
        expect(new TextDecoder().decode((await reader.read()).value)).toBe(': queued\n\n');
        expect(order).toEqual([]);
        // Waiting for the slot is waiting in the queue: the two waiting fill QUEUE_MAX=2, and a third is
        // refused as a full queue refuses (before, any number waited, each asking Redis every 200 ms).
        const third = await two.client.images.generate({ model: 'demo-shapes', prompt: 'a red circle', size: '256x256' }).catch((err: unknown) => err);
        expect(third).toMatchObject({ status: 429, code: 'rate_limit_exceeded' });
        expect((third as { message: string }).message).toMatch(/generation queue is full/);
        return { short, reader };
      })().finally(resume);
      let rest = '';
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) rest += new TextDecoder().decode(chunk.value);
      expect(rest).toMatch(/^event: image_generation\.completed$/m);
      await Promise.all([long, short]);
      expect(order[0]).toBe('long');
    } finally {
      await Promise.all([one.close(), two.close()]);
      await rm(root, { recursive: true, force: true });
    }
  });

  it('runs keys without a concurrent limit at once, and holds nothing for them', async () => {
    const { slots, connection } = await replica();
    expect(await slots.hold({ label: 'erin', limits: {} }, never, async () => 'ran')).toBe('ran');
    expect(await connection.exists('imagegen:slots:erin')).toBe(0);
  });
});
