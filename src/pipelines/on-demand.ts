/**
 * A component loaded on first use and released with its pipeline: the VAE encoder, which only
 * image-to-image needs, costs no memory in a worker that only makes pictures from text. A failed load
 * is not kept, so the next request tries again.
 */
export class OnDemand<T extends { release(): Promise<void> }> {
  private loading: Promise<T> | undefined;

  constructor(private readonly load: () => Promise<T>) {}

  get(): Promise<T> {
    this.loading ??= this.load().catch((err: unknown) => {
      this.loading = undefined;
      throw err;
    });
    return this.loading;
  }

  async release(): Promise<void> {
    const loaded = await this.loading?.catch(() => undefined);
    await loaded?.release();
  }
}
