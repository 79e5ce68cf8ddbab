/**
 * The order in which waiting jobs start: one FIFO line per client, and the next job comes from the
 * client that has been served the least work (start-time fair queueing, work being estimated seconds).
 * A client flooding expensive jobs is charged for each one it starts, so another client's cheap job
 * goes next as soon as a worker frees, instead of after the whole flood. A client that was idle joins at
 * the current virtual time: it gets no credit for the time it did not ask for anything.
 */
export class FairOrder<T> {
  private readonly lines = new Map<string, T[]>();
  /** Work started per client, on the virtual clock. */
  private readonly served = new Map<string, number>();
  /** The served work of the client chosen last: where clients that were idle start. */
  private virtualTime = 0;
  private count = 0;

  get size(): number {
    return this.count;
  }

  push(client: string, item: T): void {
    this.line(client).push(item);
    this.count++;
  }

  /** Back to the head of the client's line (a job that did not run after all). */
  pushFront(client: string, item: T): void {
    this.line(client).unshift(item);
    this.count++;
  }

  remove(item: T): void {
    for (const [client, line] of this.lines) {
      const at = line.indexOf(item);
      if (at < 0) continue;
      line.splice(at, 1);
      this.count--;
      if (line.length === 0) this.lines.delete(client);
      return;
    }
  }

  /** The client's next item, if it has one waiting. */
  peek(client: string): T | undefined {
    return this.lines.get(client)?.[0];
  }

  /** Takes the next item of the least-served client among those `eligible` (e.g. under their concurrency limit). */
  next(eligible: (client: string) => boolean): T | undefined {
    let chosen: string | undefined;
    for (const client of this.lines.keys()) {
      if (!eligible(client)) continue;
      if (chosen === undefined || this.servedOf(client) < this.servedOf(chosen)) chosen = client;
    }
    if (chosen === undefined) return undefined;
    this.virtualTime = Math.max(this.virtualTime, this.servedOf(chosen));
    const line = this.lines.get(chosen)!;
    const item = line.shift()!;
    this.count--;
    if (line.length === 0) this.lines.delete(chosen);
    return item;
  }

  /** Adds work a client started (or, negative, refunds work that did not run). */
  charge(client: string, work: number): void {
    this.served.set(client, this.servedOf(client) + work);
  }

  *entries(): Iterable<T> {
    for (const line of this.lines.values()) yield* line;
  }

  private line(client: string): T[] {
    let line = this.lines.get(client);
    if (!line) {
      line = [];
      this.lines.set(client, line);
      // Idle until now: no credit for the past, and no debt older than the current virtual time.
      this.served.set(client, Math.max(this.servedOf(client), this.virtualTime));
      this.forgetIdle();
    }
    return line;
  }

  private servedOf(client: string): number {
    return this.served.get(client) ?? this.virtualTime;
  }

  /** Drops the records of idle clients that are not ahead of the clock: they would start from it anyway. */
  private forgetIdle(): void {
    for (const [client, work] of this.served) if (!this.lines.has(client) && work <= this.virtualTime) this.served.delete(client);
  }
}
