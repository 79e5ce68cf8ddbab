import { EventEmitter, once } from 'node:events';

/**
 * A number of bytes shared out among users: each holds what it needs as it goes, and gives all it held
 * back when done. What does not fit the `room` left is refused by the caller, which says so, or waits
 * for a release (`freed`) and asks again (http/memory-share.ts does both). Bytes may be held for a
 * holder (a client), who then has room for at most `share` of the whole, however much is free: else one
 * holder could take all of it and leave every other one refused for as long as it held it. What is in
 * memory already and must stay there (an answer made) is held whether it fits or not, and leaves less
 * room, or none, to what asks next. Bytes may also be set aside for what is yet to come (an answer
 * being made): they count as held, and `roomBesidesAside` tells the room the rest leaves.
 */
export class ByteBudget {
  private used = 0;
  private readonly holders = new Holdings();
  private asideTotal = 0;
  private readonly asideHolders = new Holdings();
  /** Says 'freed' on each release, to those waiting for room. */
  private readonly releases = new EventEmitter().setMaxListeners(0);

  constructor(
    readonly limit: number,
    readonly share = limit,
  ) {}

  /** A budget of which one client may hold half, or `largest` (the most one request may need) where that is more: see clientShare. */
  static perClient(limit: number, largest: number): ByteBudget {
    return new ByteBudget(limit, clientShare(limit, largest));
  }

  /** What all holders hold now, set aside included (past the limit, where some was held that did not fit). */
  get held(): number {
    return this.used;
  }

  /** What `holder` may take now: what is free, and of a named holder, no more than its share leaves it. */
  room(holder?: string): number {
    return this.roomLeft(this.used, holder === undefined ? undefined : this.heldBy(holder));
  }

  /** What `holder` could take were nothing set aside: the room what is held leaves, which only its holders give back. */
  roomBesidesAside(holder?: string): number {
    return this.roomLeft(this.used - this.asideTotal, holder === undefined ? undefined : this.heldBy(holder) - this.asideHolders.of(holder));
  }

  /** Counts `bytes` for `holder` whether they fit or not. */
  hold(bytes: number, holder?: string): void {
    this.used += bytes;
    this.holders.add(holder, bytes);
  }

  release(bytes: number, holder?: string): void {
    this.used -= bytes;
    this.holders.add(holder, -bytes);
    this.releases.emit('freed');
  }

  /** Counts `bytes` set aside for `holder` as held, whether they fit or not; negative, gives that many back. */
  setAside(bytes: number, holder?: string): void {
    this.asideTotal += bytes;
    this.asideHolders.add(holder, bytes);
    if (bytes >= 0) this.hold(bytes, holder);
    else this.release(-bytes, holder);
  }

  /** Settles at the next release (whoever gave back, and however little: ask again), or rejects once `signal` aborts. */
  async freed(signal: AbortSignal): Promise<void> {
    await once(this.releases, 'freed', { signal });
  }

  /** The room `used` bytes leave, and where a holder's `holderHeld` are given, no more than its share leaves it. */
  private roomLeft(used: number, holderHeld?: number): number {
    const free = this.limit - used;
    return holderHeld === undefined ? free : Math.min(free, this.share - holderHeld);
  }

  /** What `holder` holds now. */
  heldBy(holder: string): number {
    return this.holders.of(holder);
  }
}

/**
 * Bytes each holder (a client) holds of something shared: ByteBudget's, and the image store's for each
 * key (store/space.ts). A holder left with nothing is dropped, so that clients gone (keys rotated out)
 * leave nothing behind.
 */
export class Holdings {
  private readonly held = new Map<string, number>();

  /** What `holder` holds now (nothing: 0). */
  of(holder: string): number {
    return this.held.get(holder) ?? 0;
  }

  /** Adds `bytes` (gives them back, when negative) to what `holder` holds; of no holder (undefined), counts nothing. */
  add(holder: string | undefined, bytes: number): void {
    if (holder === undefined || bytes === 0) return;
    const left = this.of(holder) + bytes;
    if (left > 0) this.held.set(holder, left);
    else this.held.delete(holder);
  }

  clear(): void {
    this.held.clear();
  }
}

/**
 * What one client may hold of `limit` that clients share: half, so that others always find room, or
 * `largest` (the most one request may need) where that is more, so that a lone request always fits.
 * UPLOAD_MEMORY (http/body-memory.ts), ANSWER_MEMORY (http/answer-memory.ts) and MAX_STORE_BYTES
 * (store/space.ts) share out so.
 */
export const clientShare = (limit: number, largest: number): number => Math.min(limit, Math.max(limit / 2, largest));
