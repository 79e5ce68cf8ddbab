import { RequeueError, Ticket, type JobOptions, type RunningJob } from './job-queue.js';
import { LeftItems } from './left-items.js';
import { everyItemMade, type BatchEvent, type BatchItem, type GeneratedImage, type GenerationBatch } from '../runtime/types.js';

/**
 * Merges requests for the same model, size and settings that wait for a worker together into one
 * batch, so they share one denoising loop (one model call per step for all of them) instead of
 * running one after the other. A group stays open for joiners until a worker takes it.
 *
 * Cancellation: a member whose client leaves before the group starts is dropped from it; once the group
 * runs, the worker is told to stop at its next denoising step when every member has left, and before
 * that, which items it need not finish (see WorkerRuntime.runMerged): the members that stay are done
 * sooner, and no image is made for nobody.
 *
 * A group waits in the queue as its first member's request (ticket), weighed by the estimated cost of
 * all its members; when it starts, every member's request counts as started (see Ticket.begin). Each
 * request in it keeps its own time limit (JobScheduler.boundWait), and the group waits while any has
 * time left: a request that joined it late is not dropped when the first one's time runs out.
 *
 * Fairness: a group waits in its owner's line of the fair queue (fair-order.ts), so a request joins
 * another client's group only when that group is the owner's next to start and the joiner has nothing
 * waiting (its own request would wait about there, at the front), never one at the back of a flood,
 * nor ahead of its own client's earlier requests. When the group starts, each member's client is
 * charged for its own images; a member that leaves it while it runs is given back the share of that it
 * will not get (the steps still to come), or its client would wait behind others' requests for work it
 * cancelled. A client with a concurrency limit
 * (maxConcurrent, counted in batches) merges nothing, so that its requests count one by one: its
 * requests join no group, and its groups take no one else's request, which would wait on its limit
 * (behind its running batches) while a worker is free.
 */

/**
 * Runs one batch on a worker; `stop` aborting asks the worker to stop at its next step. `onEvent`
 * answers whether a client still there heard the event (none hears the previews of one that left).
 * The items in `left` (their clients left, others staying) need no image: undefined, if the worker spared it.
 */
export type BatchRunner = (
  batch: GenerationBatch,
  stop: AbortSignal,
  onEvent: (event: BatchEvent) => boolean,
  left: LeftItems,
) => Promise<(GeneratedImage | undefined)[]>;

/** Where groups wait for a worker (the bounded job queue, JobQueue). */
export interface JobScheduler {
  run(job: (running: RunningJob) => Promise<void>, signal: AbortSignal, options: JobOptions): Promise<void>;
  /** Admits a request joining a group as it would be admitted on its own, or answers why it may not wait (see JobQueue.admit). */
  admit(ticket: Ticket): Error | undefined;
  /**
   * Bounds the wait of a request in a group as its own would be bounded (QUEUE_TIMEOUT_SECONDS): the group's
   * place in the queue is not bounded by the queue (see JobOptions.boundsOwnWait) but abandoned once
   * every member left. `expire` gets the error; what it returns cancels the bound.
   */
  boundWait(ticket: Ticket, expire: (err: Error) => void): () => void;
}

/** Estimated seconds a batch takes (see cost-model.ts). */
export type CostEstimate = (batch: GenerationBatch) => number;

interface Member {
  items: BatchItem[];
  signal?: AbortSignal;
  ticket: Ticket;
  onEvent?(event: BatchEvent): void;
  left: boolean;
  resolve(images: GeneratedImage[]): void;
  reject(err: unknown): void;
}

interface Group {
  key: string;
  /** The client whose line the group waits in (its first member's). */
  owner: string;
  /** The request the group waits in the queue as (its first member's): its client's line, limits and admission. */
  ticket: Ticket;
  settings: BatchSettings;
  members: Member[];
  /** Aborts the group's place in the queue once every member has left. */
  abandon: AbortController;
}

const ownKey = (client: string, key: string) => `${client}\n${key}`;

/**
 * A request of a client with a concurrency limit runs as its own batch: its batches count one by one
 * against the limit, and a request of another client in its group would wait on that limit.
 */
const mergesNothing = (ticket: Ticket) => ticket.limits.maxConcurrent !== undefined;

/** A batch's settings: everything but its items. Batches with equal settings can run as one. */
type BatchSettings = Omit<GenerationBatch, 'items'>;

function settingsOf(batch: GenerationBatch): BatchSettings {
  const { items: _items, ...settings } = batch;
  return settings;
}

/** The settings as a key of the groups they share (see settingsOf). */
const keyOf = (settings: BatchSettings): string => JSON.stringify(settings, Object.keys(settings).sort());

export class BatchMerger {
  /** Groups a request may still join, by owner and key (see ownKey). */
  private readonly open = new Map<string, Group>();
  /** Each client's groups waiting for a worker, oldest first. */
  private readonly waiting = new Map<string, Group[]>();

  constructor(
    private readonly enqueue: JobScheduler,
    private readonly runner: BatchRunner,
    /** Most items one merged batch may hold (the worker still splits it under its memory bound). */
    private readonly maxItems: number,
    private readonly estimate?: CostEstimate,
  ) {}

  /** `ticket`: the request the batch belongs to (a request's batches share one); `onEvent`: its batch's events, items numbered as in `batch`. */
  generate(batch: GenerationBatch, signal?: AbortSignal, ticket = new Ticket(), onEvent?: (event: BatchEvent) => void): Promise<GeneratedImage[]> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<GeneratedImage[]>((resolve, reject) => {
      const settings = settingsOf(batch);
      const key = keyOf(settings);
      const joinable = this.joinableGroup(key, batch, ticket);
      // Joined, it adds to the work waiting: let in without a look at the queue, requests joining waiting
      // groups (up to maxItems images each) grew that past QUEUE_MAX_SECONDS, and refused none.
      const refusal = joinable && this.enqueue.admit(ticket);
      if (refusal) return reject(refusal);
      const group = joinable ?? this.openGroup(key, settings, ticket);
      const leaveWith = (reason: unknown) => {
        member.left = true;
        member.reject(reason);
        if (!group.members.every((m) => m.left)) return;
        // Not joinable from now on: the queue gives its place up only as its rejection settles, and a
        // request that joined it meanwhile (in this same turn) would fail with these members' reason.
        this.close(group);
        group.abandon.abort(reason);
      };
      const leave = () => leaveWith(signal!.reason);
      // Each request in a group waits no longer than its own would (see JobScheduler.boundWait).
      const unbound = this.enqueue.boundWait(ticket, leaveWith);
      // The listener goes as soon as the member settles, however it does: an AbortSignal.any() signal
      // with an abort listener is kept alive by Node, and this closure would keep the member's images
      // (its resolved promise) reachable for as long as the request's signal lives, i.e. for ever.
      const settled = () => {
        signal?.removeEventListener('abort', leave);
        unbound();
      };
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

  /**
   * The client's own open group of these settings, else another client's next group of them when the
   * client has nothing waiting (see Fairness above), with room for the batch; none for a client with a
   * concurrency limit.
   */
  private joinableGroup(key: string, batch: GenerationBatch, ticket: Ticket): Group | undefined {
    if (mergesNothing(ticket)) return undefined;
    const { client } = ticket;
    const fits = (group: Group | undefined) => {
      const size = group?.members.reduce((n, m) => n + (m.left ? 0 : m.items.length), 0) ?? Infinity;
      return size + batch.items.length <= Math.min(this.maxItems, batch.maxBatch ?? Infinity);
    };
    const own = this.open.get(ownKey(client, key));
    if (fits(own)) return own;
    if (this.hasWaiting(client)) return undefined;
    for (const [owner, [next]] of this.waiting) {
      if (owner !== client && next.key === key && this.open.get(ownKey(owner, key)) === next && fits(next)) return next;
    }
    return undefined;
  }

  /** Whether a request of `client` waits in a group, its own or another client's. */
  private hasWaiting(client: string): boolean {
    for (const groups of this.waiting.values()) {
      for (const group of groups) if (group.members.some((m) => !m.left && m.ticket.client === client)) return true;
    }
    return false;
  }

  /** A group for the request's batch; one that others may join unless its owner has a concurrency limit (see mergesNothing). */
  private openGroup(key: string, settings: BatchSettings, ticket: Ticket): Group {
    const owner = ticket.client;
    const group: Group = { key, owner, ticket, settings, members: [], abandon: new AbortController() };
    if (mergesNothing(ticket)) return group;
    this.open.set(ownKey(owner, key), group);
    this.waiting.set(owner, [...(this.waiting.get(owner) ?? []), group]);
    return group;
  }

  private schedule(group: Group, ticket: Ticket): void {
    const { estimate } = this;
    const cost = estimate && (() => estimate({ ...group.settings, items: group.members.flatMap((m) => (m.left ? [] : m.items)) }));
    const shares = estimate && (() => this.clientShares(group));
    this.enqueue.run((job) => this.run(group, job), group.abandon.signal, { ticket, cost, shares, boundsOwnWait: true }).catch((err) => {
      this.close(group);
      for (const m of group.members) m.reject(err);
    });
  }

  /** Each member's client's share of a group's estimated seconds (the queue charges them as it starts). */
  private clientShares(group: Group): Map<string, number> {
    const shares = new Map<string, number>();
    for (const m of group.members) {
      if (m.left) continue;
      const { client } = m.ticket;
      shares.set(client, (shares.get(client) ?? 0) + this.shareOf(group, m));
    }
    return shares;
  }

  /** A member's share of its group's estimated seconds: its own images' (an estimate is proportional to them); none without estimates. */
  private shareOf(group: Group, member: Member): number {
    return this.estimate?.({ ...group.settings, items: member.items }) ?? 0;
  }

  /** The group no longer waits: it runs, or it failed or was abandoned in the queue. */
  private close(group: Group): void {
    const key = ownKey(group.owner, group.key);
    if (this.open.get(key) === group) this.open.delete(key);
    const rest = (this.waiting.get(group.owner) ?? []).filter((g) => g !== group);
    if (rest.length) this.waiting.set(group.owner, rest);
    else this.waiting.delete(group.owner);
  }

  private async run(group: Group, job: RunningJob): Promise<void> {
    this.close(group);
    const members = group.members.filter((m) => !m.left);
    if (members.length === 0) return;
    for (const m of members) m.ticket.begin();
    const stop = new AbortController();
    const left = new LeftItems();
    // Each member's items in the batch, numbered as the worker sees them.
    const firstItems = members.map((_, i) => members.slice(0, i).reduce((n, m) => n + m.items.length, 0));
    // What the queue charged each member's client for it as the group started, just now (see clientShares).
    const charged = members.map((m) => this.shareOf(group, m));
    // The share of the batch's steps done, as last heard.
    let done = 0;
    // The batch stops at its next step once every member left; before that, a member that leaves has its items given up.
    const leaving = members.map((member, i) => () => {
      job.refund(member.ticket.client, charged[i] * (1 - done));
      if (members.every((m) => m === member || m.left)) stop.abort();
      else left.add(member.items.map((_, j) => firstItems[i] + j));
    });
    members.forEach((m, i) => m.signal?.addEventListener('abort', leaving[i], { once: true }));
    const onEvent = (event: BatchEvent) => {
      if (event.type === 'step') {
        done = event.step / event.total;
        job.progress(done);
      }
      return routeEvent(members, firstItems, event);
    };
    try {
      const images = await this.runner({ ...group.settings, items: members.flatMap((m) => m.items) }, stop.signal, onEvent, left);
      // A member that left has had its answer (its reason) already, and no images.
      for (const [i, m] of members.entries()) if (!m.left) m.resolve(everyItemMade(images.slice(firstItems[i], firstItems[i] + m.items.length)));
    } catch (err) {
      // The batch never reached a worker: the group waits again, its members with it.
      if (err instanceof RequeueError) throw err;
      for (const m of members) m.reject(err);
    } finally {
      members.forEach((m, i) => m.signal?.removeEventListener('abort', leaving[i]));
    }
  }
}


/**
 * A merged batch's event to its members: progress to all, an item's preview to the member it belongs
 * to, renumbered from its first item (`firstItems`, as run numbers them). Answers whether a member still
 * there got it.
 */
function routeEvent(members: readonly Member[], firstItems: readonly number[], event: BatchEvent): boolean {
  if (event.type === 'step') {
    for (const m of members) if (!m.left) m.onEvent?.(event);
    return members.some((m) => !m.left);
  }
  const i = members.findIndex((m, k) => event.item < firstItems[k] + m.items.length);
  const m = members[i];
  if (!m || m.left) return false;
  m.onEvent?.({ ...event, item: event.item - firstItems[i] });
  return true;
}
