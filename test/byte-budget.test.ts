import { describe, expect, it } from 'vitest';
import { ByteBudget } from '../src/util/byte-budget.js';

/**
 * ByteBudget's waiting line (src/util/byte-budget.ts takeInTurn), which ANSWER_MEMORY's waits for room
 * use (test/answer-memory.test.ts shows them over HTTP): who may pass whom, in microseconds.
 */

/** Asks `budget` in turn for `bytes` of `holder`'s, holding them once they fit; `order` records who got them. */
function ask(budget: ByteBudget, holder: string | undefined, bytes: number, order: string[], name: string, signal = new AbortController().signal) {
  const take = () => {
    if (bytes > budget.room(holder)) return false;
    budget.hold(bytes, holder);
    return true;
  };
  return budget.takeInTurn(holder, bytes, take, () => signal).then(() => void order.push(name));
}

const settled = () => new Promise((resolve) => setImmediate(resolve));

describe('ByteBudget.takeInTurn', () => {
  it('lets no later request of a holder pass its earlier one that waits, though it would fit', async () => {
    const budget = new ByteBudget(100);
    const order: string[] = [];
    budget.hold(60);
    const large = ask(budget, undefined, 50, order, 'large');
    const small = ask(budget, undefined, 10, order, 'small');
    await settled();
    expect(order).toEqual([]);
    budget.release(60);
    await Promise.all([large, small]);
    expect(order).toEqual(['large', 'small']);
  });

  it("lets other holders pass one that waits for its own share, but not one that only the whole budget is short for", async () => {
    const budget = new ByteBudget(100, 50);
    const order: string[] = [];
    // a's share is short (40 + 20 > 50): b goes at once.
    budget.hold(40, 'a');
    const shareShort = ask(budget, 'a', 20, order, 'a');
    await ask(budget, 'b', 10, order, 'b');
    expect(order).toEqual(['b']);
    budget.release(40, 'a');
    await shareShort;
    expect(order).toEqual(['b', 'a']);

    // c holds 45 and b 10, d 30: 15 are free, and e's 20 would fit its share but not the budget, so f's 5 waits behind it.
    const [crowded, line] = [new ByteBudget(100, 50), [] as string[]];
    crowded.hold(45, 'c');
    crowded.hold(30, 'd');
    crowded.hold(10, 'b');
    const wholeShort = ask(crowded, 'e', 20, line, 'e');
    const later = ask(crowded, 'f', 5, line, 'f');
    await settled();
    expect(line).toEqual([]);
    crowded.release(30, 'd');
    await Promise.all([wholeShort, later]);
    expect(line).toEqual(['e', 'f']);
  });

  it('lets no later request take the room given back to one that waits before it wakes to take it', async () => {
    const budget = new ByteBudget(100, 50);
    const order: string[] = [];
    budget.hold(40, 'a');
    budget.hold(30, 'c');
    const waits = ask(budget, 'b', 40, order, 'b');
    await settled();
    // c gives back 10: b's 40 fit now, and b takes them as it wakes. A request of d's that asks before
    // then (a release and a new request in the same turn of the event loop, or a request that began to
    // wait as b woke and so is told of the next release first) fits too, but leaves b short again.
    budget.release(10, 'c');
    const later = ask(budget, 'd', 20, order, 'd');
    await settled();
    expect(order).toEqual(['b']);
    budget.release(20, 'c');
    await Promise.all([waits, later]);
    expect(order).toEqual(['b', 'd']);
  });

  it("lets other holders pass a holder's requests that wait behind its own one waiting for its share", async () => {
    const budget = new ByteBudget(100, 50);
    const order: string[] = [];
    // x's unread answers hold 45 of its 50: its 20 wait for its share, and its 5 behind them (its turn
    // comes after), though they would fit its share. z holds 51: 4 are free, which y's 3 fit.
    budget.hold(45, 'x');
    budget.hold(51, 'z');
    const xFirst = ask(budget, 'x', 20, order, 'x20');
    const xSecond = ask(budget, 'x', 5, order, 'x5');
    const y = ask(budget, 'y', 3, order, 'y');
    await settled();
    // Before, x's 5 stood in y's way: y waited for x's clients to read their answers.
    expect(order).toEqual(['y']);
    budget.release(45, 'x');
    await Promise.all([xFirst, xSecond, y]);
    expect(order).toEqual(['y', 'x20', 'x5']);
  });

  it('lets those behind go once one ahead gives up waiting, and takes nothing for it', async () => {
    const budget = new ByteBudget(100);
    const order: string[] = [];
    budget.hold(60);
    const gone = new AbortController();
    const large = ask(budget, undefined, 50, order, 'large', gone.signal).catch((err: unknown) => err);
    const small = ask(budget, undefined, 10, order, 'small');
    await settled();
    gone.abort(new Error('client gone'));
    expect(await large).toMatchObject({ name: 'AbortError' });
    await small;
    expect(order).toEqual(['small']);
    expect(budget.held).toBe(70);
  });
});
