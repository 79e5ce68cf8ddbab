/**
 * The items of a running batch whose clients left while others stay in it (a merged batch: see
 * batcher.ts), told as they leave: the worker spares what it can of them (WorkerRuntime.runMerged).
 * The batcher adds to it; the worker's handle (worker-process.ts) passes each addition on to its process.
 */
export class LeftItems {
  private readonly items = new Set<number>();
  private listener?: (items: readonly number[]) => void;

  /** How many items left so far. */
  get size(): number {
    return this.items.size;
  }

  add(items: readonly number[]): void {
    for (const item of items) this.items.add(item);
    this.listener?.(items);
  }

  /** Calls `listener` with the items that left so far, if any, and then with those each leaving adds; answers what stops that. */
  listen(listener: (items: readonly number[]) => void): () => void {
    this.listener = listener;
    if (this.items.size > 0) listener([...this.items]);
    return () => {
      if (this.listener === listener) this.listener = undefined;
    };
  }
}
