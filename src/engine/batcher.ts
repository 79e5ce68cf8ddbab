import { RequeueError, type JobOptions, type Ticket } from './job-queue.js';
import type { BatchEvent, BatchItem, GeneratedImage, GenerationBatch } from '../runtime/types.js';

/**
 * Merges requests for the same model, size and settings that wait for a worker together into one
 * batch, so they share one denoising loop (one model call per step for all of them) instead of
 * running one after the other. A group stays open for joiners until a worker takes it.
 *
 * Cancellation: a member whose client leaves before the group starts is dropped from it; once the group
 * runs, the worker is told to stop at its next denoising step only when every member has left.
 *
 * A group waits in the queue as its first member's request (ticket), weighed by the estimated cost of
 * all its members; when it starts, every member's request counts as started (see Ticket.begin).
 */

/** Runs one batch on a worker; `stop` aborting asks the worker to stop at its next step. */
export type BatchRunner = (batch: GenerationBatch, stop: AbortSignal, onEvent: (event: BatchEvent) => void) => Promise<GeneratedImage[]>;

/** Where groups wait for a worker (the bounded job queue). */
export type JobScheduler = (job: () => Promise<void>, signal: AbortSignal, options: JobOptions) => Promise<void>;

/** Estimated seconds a batch takes (see cost-model.ts). */
export type CostEstimate = (batch: GenerationBatch) => number;

interface Member {
  items: BatchItem[];
  signal?: AbortSignal;
  ticket?: Ticket;
  onEvent?(event: BatchEvent): void;
  left: boolean;
  resolve(images: GeneratedImage[]): void;
  reject(err: unknown): void;
}

interface Group {
  key: string;
  settings: Omit<GenerationBatch, 'items'>;
  members: Member[];
  /** Aborts the group's place in the queue once every member has left. */
  abandon: AbortController;
}

/** Batches with equal keys can run as one: everything but the items. */
export function batchKey(batch: GenerationBatch): string {
  const { items: _items, ...settings } = batch;
  return JSON.stringify(settings, Object.keys(settings).sort());
}

export class BatchMerger {
  private readonly open = new Map<string, Group>();

  constructor(
    private readonly enqueue: JobScheduler,
    private readonly runner: BatchRunner,
    /** Most items one merged batch may hold (the worker still splits it under its memory bound). */
    private readonly maxItems: number,
    private readonly estimate?: CostEstimate,
  ) {}

  /** `ticket`: the request the batch belongs to (a request's batches share one); `onEvent`: its batch's events, items numbered as in `batch`. */
  generate(batch: GenerationBatch, signal?: AbortSignal, ticket?: Ticket, onEvent?: (event: BatchEvent) => void): Promise<GeneratedImage[]> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<GeneratedImage[]>((resolve, reject) => {
      const key = batchKey(batch);
      const joinable = this.joinableGroup(key, batch);
      const group = joinable ?? this.openGroup(key, batch);
      const leave = () => {
        member.left = true;
        member.reject(signal!.reason);
        if (group.members.every((m) => m.left)) group.abandon.abort(signal!.reason);
      };
      // The listener goes as soon as the member settles, however it does: an AbortSignal.any() signal
      // with an abort listener is kept alive by Node, and this closure would keep the member's images
      // (its resolved promise) reachable for as long as the request's signal lives, i.e. for ever.
      const settled = () => signal?.removeEventListener('abort', leave);
      const member: Member = {
        items: batch.items,
        signal,
        ticket,
        onEvent,
        left: false,
        resolve: (images) => {
          settled();
          resolve(images);
        },
        reject: (err) => {
          settled();
          reject(err);
        },
      };
      group.members.push(member);
      signal?.addEventListener('abort', leave, { once: true });
      // Scheduled after the first member joined: a free worker may start the group at once.
      if (!joinable) this.schedule(group, ticket);
    });
  }

  private joinableGroup(key: string, batch: GenerationBatch): Group | undefined {
    const group = this.open.get(key);
    if (!group) return undefined;
    const size = group.members.reduce((n, m) => n + (m.left ? 0 : m.items.length), 0);
    return size + batch.items.length <= Math.min(this.maxItems, batch.maxBatch ?? Infinity) ? group : undefined;
  }

  private openGroup(key: string, batch: GenerationBatch): Group {
    const { items: _items, ...settings } = batch;
    const group: Group = { key, settings, members: [], abandon: new AbortController() };
    this.open.set(group.key, group);
    return group;
  }

  private schedule(group: Group, ticket?: Ticket): void {
    const { estimate } = this;
    const cost = estimate && (() => estimate({ ...group.settings, items: group.members.flatMap((m) => (m.left ? [] : m.items)) }));
    this.enqueue(() => this.run(group), group.abandon.signal, { ticket, cost }).catch((err) => {
      this.close(group);
      for (const m of group.members) m.reject(err);
    });
  }

  private close(group: Group): void {
    if (this.open.get(group.key) === group) this.open.delete(group.key);
  }

  private async run(group: Group): Promise<void> {
    this.close(group);
    const members = group.members.filter((m) => !m.left);
    if (members.length === 0) return;
    for (const m of members) m.ticket?.begin();
    const stop = new AbortController();
    const stopIfAllLeft = () => {
      if (members.every((m) => m.left)) stop.abort();
    };
    for (const m of members) m.signal?.addEventListener('abort', stopIfAllLeft, { once: true });
    try {
      const images = await this.runner({ ...group.settings, items: members.flatMap((m) => m.items) }, stop.signal, (event) => routeEvent(members, event));
      let offset = 0;
      for (const m of members) {
        m.resolve(images.slice(offset, offset + m.items.length));
        offset += m.items.length;
      }
    } catch (err) {
      // The batch never reached a worker: the group waits again, its members with it.
      if (err instanceof RequeueError) throw err;
      for (const m of members) m.reject(err);
    } finally {
      for (const m of members) m.signal?.removeEventListener('abort', stopIfAllLeft);
    }
  }
}

/** A merged batch's event to its members: progress to all, an item's preview to the member it belongs to, renumbered. */
function routeEvent(members: readonly Member[], event: BatchEvent): void {
  if (event.type === 'step') {
    for (const m of members) if (!m.left) m.onEvent?.(event);
    return;
  }
  let first = 0;
  for (const m of members) {
    if (event.item < first + m.items.length) {
      if (!m.left) m.onEvent?.({ ...event, item: event.item - first });
      return;
    }
    first += m.items.length;
  }
}
