import { EventEmitter, once } from 'node:events';

/**
 * A number of bytes shared out among users: each holds what it needs as it goes, and gives all it held
 * back when done. What does not fit the `room` left is refused by the caller, which says so, or waits
 * its turn for room to be given back (`takeInTurn`; http/memory-share.ts does both). Bytes may be held
 * for a holder (a client), who then has room for at most `share` of the whole, however much is free:
 * else one holder could take all of it and leave every other one refused for as long as it held it.
 * What is in memory already and must stay there (an answer made) is held whether it fits or not, and
 * leaves less room, or none, to what asks next. Bytes may also be set aside for what is yet to come (an
 * answer being made): they count as held, and `roomBesidesAside` tells the room the rest leaves.
 *
 * Those waiting for room take it in the order they came (takeInTurn), as Go's semaphore.Weighted does:
 * let each take whatever fitted on a release, a request needing much lost every race to a flow of small
 * ones and waited out its time. Our own rather than a semaphore library: none counts bytes held past the
 * limit, per-holder shares and bytes set aside, which the waits here are for.
 */
export class ByteBudget {
  private used = 0;
  private readonly holders = new Holdings();
  private asideTotal = 0;
  private readonly asideHolders = new Holdings();
  /** Says 'freed' on each release, to those waiting for room. */
  private readonly releases = new EventEmitter().setMaxListeners(0);
  /** Those waiting for room, in the order they came. */
  private readonly waiting: Waiter[] = [];

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

  /**
   * Runs `take`, which takes room for `bytes` more of `holder`'s where they fit (true) and else nothing
   * (false), in its turn: at once unless an earlier waiter stands in its way (mayGo), and else, having
   * called `onWait` (what it throws ends the wait), after each release until it does take, resolving
   * then; rejects, having taken nothing, once the signal `onWait` gave aborts. Asked for only as the
   * wait begins: a request that takes its room at once makes no signal to end a wait it never has.
   */
  async takeInTurn(holder: string | undefined, bytes: number, take: () => boolean, onWait: () => AbortSignal): Promise<void> {
    if (this.mayGo(holder, bytes, this.waiting) && take()) return;
    const signal = onWait();
    const me: Waiter = { holder, bytes };
    this.waiting.push(me);
    try {
      do await once(this.releases, 'freed', { signal });
      while (!(this.mayGo(holder, bytes, this.waiting.slice(0, this.waiting.indexOf(me))) && take()));
    } finally {
      this.waiting.splice(this.waiting.indexOf(me), 1);
      // Those behind it may go now: it took its room, or stands in their way no longer.
      this.releases.emit('freed');
    }
  }

  /**
   * Whether `holder`'s request for `bytes` may take room before `ahead`, those waiting that came before
   * it: not while one of the same holder's waits (its turn is first), nor while one waits that only the
   * whole budget is short for once this one took its bytes. That one may fit now, room given back that
   * it has yet to wake to: this one, asking in between, would take it. One waiting for its holder's
   * share to free up stands in no other holder's way: it waits on its own holder's answers, and other
   * holders are served meanwhile, which is what shares are for. Nor do its holder's requests behind it,
   * which wait for it whatever room there is.
   */
  private mayGo(holder: string | undefined, bytes: number, ahead: readonly Waiter[]): boolean {
    const onTheirOwn = new Set<string>();
    const inTheWay = (waiter: Waiter) => {
      if (waiter.holder === holder) return true;
      if (waiter.holder !== undefined && (onTheirOwn.has(waiter.holder) || waiter.bytes > this.share - this.heldBy(waiter.holder))) {
        onTheirOwn.add(waiter.holder);
        return false;
      }
      return waiter.bytes > this.room() - bytes;
    };
    return !ahead.some(inTheWay);
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

/** One waiting for room: whose request, and how many bytes more it needs. */
interface Waiter {
  holder?: string;
  bytes: number;
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
