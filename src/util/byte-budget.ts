/**
 * A number of bytes shared out among users: each takes what it needs as it goes, and gives all it took
 * back when done. Nothing waits: a take that does not fit is refused, and the caller says so. A take
 * may name its holder (a client), who then gets at most `share` of the whole, however much is free:
 * else one holder could take all of it and leave every other one refused for as long as it held it.
 */
export class ByteBudget {
  private used = 0;
  /** What each named holder holds now (none: nothing). */
  private readonly holders = new Map<string, number>();

  constructor(
    readonly limit: number,
    readonly share = limit,
  ) {}

  /** What `holder` may take now: what is free, and of a named holder, no more than its share leaves it. */
  room(holder?: string): number {
    const free = this.limit - this.used;
    return holder === undefined ? free : Math.min(free, this.share - this.heldBy(holder));
  }

  /** Takes `bytes` for `holder` if they fit; false (taking nothing) if not. */
  take(bytes: number, holder?: string): boolean {
    if (bytes > this.room(holder)) return false;
    this.used += bytes;
    if (holder !== undefined) this.holders.set(holder, this.heldBy(holder) + bytes);
    return true;
  }

  release(bytes: number, holder?: string): void {
    this.used -= bytes;
    if (holder === undefined) return;
    const left = this.heldBy(holder) - bytes;
    if (left > 0) this.holders.set(holder, left);
    else this.holders.delete(holder);
  }

  /** What `holder` holds now. */
  heldBy(holder: string): number {
    return this.holders.get(holder) ?? 0;
  }
}

/**
 * What one client may hold of `limit` that clients share: half, so that others always find room, or
 * `largest` (the most one request may need) where that is more, so that a lone request always fits.
 * UPLOAD_MEMORY (http/body-memory.ts) and MAX_STORE_BYTES (store/space.ts) share out so.
 */
export const clientShare = (limit: number, largest: number): number => Math.min(limit, Math.max(limit / 2, largest));
