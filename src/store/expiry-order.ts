/**
 * A store's images in the order they expire, for which have expired and "when will this much space be
 * free" (the Retry-After of a full store's 507), both read at every refusal. Sorting the whole index for
 * every refusal took 125 ms of the server's one thread per 507 with 524,288 images (MAX_STORE_BYTES=2g
 * full of tiny ones), so a flood of url requests against a full store stalled every other client. Here
 * a put appends (an image expires at its put's time plus the TTL, so puts come in order), the order is
 * sorted again only after something came out of it (a listing's images, a clock set back), and images
 * no longer stored are dropped in one pass once they are half of what follows the front, as they are
 * removed, read or not (a store that never fills never reads it); the front a read passed over is shed
 * at the next read once it is half. So it holds a bounded multiple of the images stored (about four
 * times at most). A refusal reads only the images that expire first.
 */
export class ExpiryOrder<T extends { expiresAt: number }> {
  private items: T[] = [];
  private sorted = true;
  /** Items removed from the store but still in `items` from `head` on. */
  private removed = 0;
  /** Items before it are no longer stored: expired and deleted, the usual way out, they leave from the front. */
  private head = 0;

  /** `isStored`: whether the store still holds the item (those it no longer does are skipped and dropped). */
  constructor(private readonly isStored: (item: T) => boolean) {}

  add(item: T): void {
    const last = this.items.at(-1);
    if (last && item.expiresAt < last.expiresAt) this.sorted = false;
    this.items.push(item);
  }

  /**
   * Counts one item that has left the store, which the caller has already dropped (isStored says no for
   * it now): it is skipped, and dropped with the others once they are half.
   */
  noteRemoved(): void {
    this.removed += 1;
    if (this.removed > (this.items.length - this.head) / 2) this.dropRemoved();
  }

  /** The items still stored, earliest expiry first, read for as long as the caller takes them. */
  *inOrder(): Generator<T> {
    if (!this.sorted) {
      this.dropRemoved();
      this.items.sort((a, b) => a.expiresAt - b.expiresAt);
      this.sorted = true;
    }
    if (this.head > this.items.length / 2) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    for (let i = this.head; i < this.items.length; i++) {
      const item = this.items[i];
      if (this.isStored(item)) yield item;
      else if (i === this.head) {
        // Passed over once, not at every read: a full store's refusals would each read every image that expired since the last drop.
        this.head += 1;
        this.removed -= 1;
      }
    }
  }

  private dropRemoved(): void {
    this.items = this.items.filter(this.isStored);
    this.head = 0;
    this.removed = 0;
  }
}
