import type { StoreReservation } from './image-store.js';

/** A store's reservation: puts draw on it, and release() hands back what they did not use, once. */
export class SpaceReservation implements StoreReservation {
  constructor(
    private remaining: number,
    readonly owner: string | undefined,
    private readonly giveBack: (unused: number) => void,
  ) {}

  get bytes(): number {
    return this.remaining;
  }

  /** Takes up to `bytes` from the reservation; returns how many it covered. */
  draw(bytes: number): number {
    const covered = Math.min(bytes, this.remaining);
    this.remaining -= covered;
    return covered;
  }

  release(): void {
    this.giveBack(this.remaining);
    this.remaining = 0;
  }
}
