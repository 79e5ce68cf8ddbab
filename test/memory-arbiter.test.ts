import { describe, expect, it } from 'vitest';
import { MemoryArbiter, type MemoryClaimant, type MemoryGrant } from '../src/engine/memory-arbiter.js';

/**
 * The pool's memory arbiter on its own, with readings the test sets: workers plan one at a time, each
 * counting what the others' running batches planned and have not taken yet. (test/memory-pool.test.ts
 * runs it between real worker processes.)
 */

const GiB = 2 ** 30;

class Worker implements MemoryClaimant {
  readonly grants: MemoryGrant[] = [];
  constructor(readonly pid: number) {}
  grantMemory(grant: MemoryGrant): void {
    this.grants.push(grant);
  }
  get last(): MemoryGrant | undefined {
    return this.grants.at(-1);
  }
}

function setUp(free = 10 * GiB, limit = Infinity) {
  const readings = { free, resident: new Map<number, number>() };
  const arbiter = new MemoryArbiter({ plannable: () => readings.free, resident: (pid) => readings.resident.get(pid) }, limit);
  return { arbiter, readings, a: new Worker(1), b: new Worker(2) };
}

describe('the memory arbiter', () => {
  it('lets one worker plan at a time, and counts what the others planned', () => {
    const { arbiter, a, b } = setUp();
    arbiter.ask(a);
    arbiter.ask(b);
    expect(a.last).toEqual({ budget: 10 * GiB, alone: 10 * GiB });
    // b's turn comes only once a has said what it takes: the two never plan with the same free bytes.
    expect(b.grants).toEqual([]);
    arbiter.take(a, 6 * GiB);
    expect(b.last).toEqual({ budget: 4 * GiB, alone: 10 * GiB });
    expect(arbiter.plannedBytes()).toBe(6 * GiB);
  });

  it('counts only what a running batch has not taken yet: its worker grew by the rest, which free memory shows', () => {
    const { arbiter, readings, a, b } = setUp();
    readings.resident.set(1, GiB);
    arbiter.ask(a);
    arbiter.take(a, 6 * GiB);
    // a's worker grew by 4 GiB: the machine has 4 GiB less free, and a will take 2 GiB more.
    readings.resident.set(1, 5 * GiB);
    readings.free = 6 * GiB;
    arbiter.ask(b);
    expect(b.last).toEqual({ budget: 4 * GiB, alone: 6 * GiB });
  });

  it("parks a worker that waits until a running batch ends, then grants it again", () => {
    const { arbiter, a, b } = setUp();
    arbiter.ask(a);
    arbiter.take(a, 8 * GiB);
    arbiter.ask(b);
    expect(arbiter.wait(b)).toBe(true);
    expect(arbiter.isWaiting(b)).toBe(true);
    expect(b.grants).toHaveLength(1);
    arbiter.release(a);
    expect(b.grants).toHaveLength(2);
    expect(b.last).toEqual({ budget: 10 * GiB, alone: 10 * GiB });
    arbiter.take(b, 8 * GiB);
    expect(arbiter.isWaiting(b)).toBe(false);
  });

  it('asks again at once for a worker that chose to wait after the batch it waited for had ended', () => {
    const { arbiter, a, b } = setUp();
    arbiter.ask(a);
    arbiter.take(a, 8 * GiB);
    arbiter.ask(b);
    // a ends while b decides on its grant (budget 2 GiB): b's wait must not park it for ever.
    arbiter.release(a);
    arbiter.wait(b);
    expect(b.grants).toHaveLength(2);
    expect(b.last!.budget).toBe(10 * GiB);
  });

  it('forgets a worker that dies or whose batch ends while it plans or waits, and passes the turn on', () => {
    const { arbiter, a, b } = setUp();
    arbiter.ask(a);
    arbiter.ask(b);
    arbiter.release(a);
    expect(b.grants).toHaveLength(1);
    arbiter.take(b, GiB);
    const c = new Worker(3);
    arbiter.ask(c);
    arbiter.wait(c);
    arbiter.release(c);
    expect(arbiter.isWaiting(c)).toBe(false);
    // Messages from a worker whose turn it is not change nothing.
    arbiter.take(a, 9 * GiB);
    expect(arbiter.wait(a)).toBe(false);
    expect(arbiter.plannedBytes()).toBe(GiB);
  });

  it('keeps all running batches together within the limit, even once they have taken what they planned', () => {
    const { arbiter, readings, a, b } = setUp(20 * GiB, 8 * GiB);
    readings.resident.set(1, GiB);
    arbiter.ask(a);
    expect(a.last).toEqual({ budget: 8 * GiB, alone: 8 * GiB });
    arbiter.take(a, 6 * GiB);
    // a's worker took all 6 GiB: free memory alone would leave b 14 GiB, the limit leaves it 2.
    readings.resident.set(1, 7 * GiB);
    readings.free = 14 * GiB;
    arbiter.ask(b);
    expect(b.last).toEqual({ budget: 2 * GiB, alone: 8 * GiB });
  });

  it('grants nothing to other batches while exclusive work waits, so it waits only for the batches already running', () => {
    const { arbiter, a, b } = setUp();
    const calibration = new Worker(3);
    arbiter.ask(a);
    arbiter.take(a, 4 * GiB);
    // The calibration asks while a's batch holds 4 GiB it has not taken: less than all there is, so it waits.
    arbiter.ask(calibration, true);
    expect(calibration.last).toEqual({ budget: 6 * GiB, alone: 10 * GiB });
    arbiter.wait(calibration);
    // A batch asking meanwhile gets nothing, though 6 GiB are left: it waits behind the calibration.
    arbiter.ask(b);
    expect(b.last).toEqual({ budget: 0, alone: 10 * GiB });
    arbiter.wait(b);
    // a's batch ends: the calibration gets all there is and takes it; b still gets nothing beside it.
    arbiter.release(a);
    expect(calibration.last).toEqual({ budget: 10 * GiB, alone: 10 * GiB });
    arbiter.take(calibration, 10 * GiB);
    expect(b.last).toEqual({ budget: 0, alone: 10 * GiB });
    arbiter.wait(b);
    // Once it ends, b plans as before.
    arbiter.release(calibration);
    expect(b.last).toEqual({ budget: 10 * GiB, alone: 10 * GiB });
  });

  it('lets two exclusive claimants go one after the other, not block each other', () => {
    const { arbiter, a, b } = setUp();
    arbiter.ask(a, true);
    arbiter.ask(b, true);
    expect(a.last).toEqual({ budget: 10 * GiB, alone: 10 * GiB });
    arbiter.take(a, 10 * GiB);
    expect(b.last).toEqual({ budget: 0, alone: 10 * GiB });
    arbiter.wait(b);
    arbiter.release(a);
    expect(b.last).toEqual({ budget: 10 * GiB, alone: 10 * GiB });
  });
});
