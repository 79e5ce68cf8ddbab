/**
 * A number of bytes shared out among users: each takes what it needs as it goes, and gives all it took
 * back when done. Nothing waits: a take that does not fit is refused, and the caller says so.
 */
export class ByteBudget {
  private used = 0;

  constructor(readonly limit: number) {}

  /** Takes `bytes` if they fit; false (taking nothing) if not. */
  take(bytes: number): boolean {
    if (this.used + bytes > this.limit) return false;
    this.used += bytes;
    return true;
  }

  release(bytes: number): void {
    this.used -= bytes;
  }

  get inUse(): number {
    return this.used;
  }
}
