import { describe, expect, it } from 'vitest';
import { ExpiryOrder } from '../src/store/expiry-order.js';

/** A full store's Retry-After reads its images in the order they expire, without sorting them all each time. */

const image = (expiresAt: number) => ({ expiresAt });

describe('images in the order they expire', () => {
  it('reads them earliest first, also after some came out of order (a listing, a clock set back)', () => {
    const order = new ExpiryOrder<{ expiresAt: number }>();
    const items = [30, 10, 20, 50, 40].map(image);
    for (const item of items) order.add(item);
    expect([...order.inOrder(() => true)].map((i) => i.expiresAt)).toEqual([10, 20, 30, 40, 50]);
    order.add(image(5));
    expect(order.inOrder(() => true).next().value).toEqual({ expiresAt: 5 });
  });

  it('skips images no longer stored, and keeps reading correctly as they are dropped', () => {
    const order = new ExpiryOrder<{ expiresAt: number }>();
    const items = Array.from({ length: 10 }, (_, i) => image(i));
    for (const item of items) order.add(item);
    const stored = new Set(items);
    for (const gone of items.slice(0, 7)) {
      stored.delete(gone);
      order.remove();
      expect([...order.inOrder((i) => stored.has(i))]).toEqual(items.filter((i) => stored.has(i)));
    }
    const later = image(20);
    order.add(later);
    stored.add(later);
    expect([...order.inOrder((i) => stored.has(i))].map((i) => i.expiresAt)).toEqual([7, 8, 9, 20]);
  });

  it('reads only as far as its reader takes', () => {
    const order = new ExpiryOrder<{ expiresAt: number }>();
    for (let i = 0; i < 1000; i++) order.add(image(i));
    let asked = 0;
    for (const item of order.inOrder(() => (asked++, true))) if (item.expiresAt === 2) break;
    expect(asked).toBe(3);
  });
});
