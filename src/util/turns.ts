/**
 * At most `size` tasks run at once; the others wait their turn, first come first served. For work
 * whose memory grows with how many run together and that nothing else bounds.
 */
export class Turns {
  private running = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(private readonly size: number) {}

  async run<T>(task: () => Promise<T>): Promise<T> {
    if (this.running < this.size) this.running++;
    // The finishing task hands its place on (running stays as it was), so no newcomer takes it first.
    else await new Promise<void>((resolve) => this.waiting.push(resolve));
    try {
      return await task();
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.running--;
    }
  }
}
