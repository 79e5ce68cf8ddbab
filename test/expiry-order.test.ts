import { describe, expect, it } from 'vitest';
import { ExpiryOrder } from '../src/store/expiry-order.js';

/** A full store's Retry-After reads its images in the order they expire, without sorting them all each time. */

type Item = { expiresAt: number };
const image = (expiresAt: number): Item => ({ expiresAt });

/** An order over a set of stored items, counting how often it asks whether one is stored. */
function storedOrder() {
  const stored = new Set<Item>();
  const counted = { asked: 0 };
  const order = new ExpiryOrder<Item>((item) => (counted.asked++, stored.has(item)));
  const add = (item: Item) => (stored.add(item), order.add(item));
  const remove = (item: Item) => (stored.delete(item), order.noteRemoved());
  return { order, stored, counted, add, remove };
}

describe('images in the order they expire', () => {
  it('reads them earliest first, also after some came out of order (a listing, a clock set back)', () => {
    const { order, add } = storedOrder();
    for (const item of [30, 10, 20, 50, 40].map(image)) add(item);
    expect([...order.inOrder()].map((i) => i.expiresAt)).toEqual([10, 20, 30, 40, 50]);
    add(image(5));
    expect(order.inOrder().next().value).toEqual({ expiresAt: 5 });
  });

  it('skips images no longer stored, and keeps reading correctly as they are dropped', () => {
    const { order, stored, add, remove } = storedOrder();
    const items = Array.from({ length: 10 }, (_, i) => image(i));
    for (const item of items) add(item);
    for (const gone of items.slice(0, 7)) {
      remove(gone);
      expect([...order.inOrder()]).toEqual(items.filter((i) => stored.has(i)));
    }
    add(image(20));
    expect([...order.inOrder()].map((i) => i.expiresAt)).toEqual([7, 8, 9, 20]);
  });

  it('drops the images no longer stored as they go, though nothing reads the order (a store that never fills)', () => {
    const { order, counted, add, remove } = storedOrder();
    // A day of puts, each image swept as it expires: what the order holds stays about what is stored.
    const items = Array.from({ length: 10_000 }, (_, i) => image(i));
    items.forEach((item, i) => {
      add(item);
      if (i >= 10) remove(items[i - 10]);
    });
    counted.asked = 0;
    expect([...order.inOrder()]).toHaveLength(10);
    expect(counted.asked).toBeLessThanOrEqual(30);
  });

  it('passes over the images that left from the front (expired) once, not at every read', () => {
    const { order, counted, add, remove } = storedOrder();
    const items = Array.from({ length: 1000 }, (_, i) => image(i));
    for (const item of items) add(item);
    for (const gone of items.slice(0, 400)) remove(gone);
    expect(order.inOrder().next().value).toBe(items[400]);
    counted.asked = 0;
    expect(order.inOrder().next().value).toBe(items[400]);
    expect(counted.asked).toBe(1);
  });

  it('reads only as far as its reader takes', () => {
    const { order, counted, add } = storedOrder();
    for (let i = 0; i < 1000; i++) add(image(i));
    counted.asked = 0;
    for (const item of order.inOrder()) if (item.expiresAt === 2) break;
    expect(counted.asked).toBe(3);
  });
});
