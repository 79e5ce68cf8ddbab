/**
 * The pool's memory arbiter: workers plan their batches one at a time against the same free memory,
 * each counting what the others' running batches planned on and have not taken yet. Without it two
 * workers planning at the same instant would both count on the same free bytes, and the kernel's OOM
 * killer would settle it.
 *
 * A worker asks (ask), and when its turn comes gets a grant: `alone`, what batches may plan on now
 * (see plannableBytes), and `budget`, that less what the other running batches planned and have not
 * yet taken (their planned bytes less their worker's resident growth since), and within a limit
 * (MEMORY_LIMIT) less all they planned. It answers with the bytes it takes (take), or, when its batch
 * fits `alone` but not `budget`, that it waits (wait): it asks again when another batch ends. A
 * batch's bytes are held until it ends (release).
 *
 * Work whose memory nobody knows beforehand (a model's calibration) asks as `exclusive`: it waits until
 * no other batch holds memory it has not taken, then takes all there is. While the first such claimant
 * waits, every other is granted nothing, so new batches cannot keep it waiting: it waits only for the
 * batches running when it asked.
 */

/** What a worker is granted: see the module's comment. */
export interface MemoryGrant {
  budget: number;
  alone: number;
}

/** A worker as the arbiter sees it: its process (whose resident memory shows what it took) and its grants. */
export interface MemoryClaimant {
  readonly pid?: number;
  grantMemory(grant: MemoryGrant): void;
}

/** The readings the arbiter plans with: the machine's (runtime/memory.ts) in the pool, a test's own elsewhere. */
export interface MemoryReadings {
  /** What batches may plan to take now (free memory less headroom, within MEMORY_LIMIT). */
  plannable(): number;
  /** A process's resident memory, where the system shows it. */
  resident(pid: number): number | undefined;
}

interface Held {
  bytes: number;
  /** The worker's resident memory when it took them: its growth since is what it has used of them. */
  residentAtTake?: number;
}

export class MemoryArbiter {
  /** The worker whose plan is being made, and the releases seen when it got its grant. */
  private turn?: { who: MemoryClaimant; releases: number };
  private readonly asking: MemoryClaimant[] = [];
  /** Workers waiting for another batch to end. */
  private readonly parked = new Set<MemoryClaimant>();
  private readonly held = new Map<MemoryClaimant, Held>();
  /** Batches that ended holding memory, so far: a worker that chose to wait after one did asks again at once. */
  private releases = 0;
  /** Exclusive claimants that have not taken their memory yet, first come first. */
  private readonly exclusive: MemoryClaimant[] = [];

  /** `limit`: the most all running batches together may plan on (MEMORY_LIMIT less the headroom). */
  constructor(
    private readonly readings: MemoryReadings,
    private readonly limit = Infinity,
  ) {}

  /** A worker is about to plan a batch (or, `exclusive`, work that takes all there is): it gets its grant when its turn comes. */
  ask(who: MemoryClaimant, exclusive = false): void {
    if (exclusive && !this.exclusive.includes(who)) this.exclusive.push(who);
    this.asking.push(who);
    this.next();
  }

  /** The worker whose turn it is planned on `bytes` (0: nothing; its batch will not run). */
  take(who: MemoryClaimant, bytes: number): void {
    if (this.turn?.who !== who) return;
    this.turn = undefined;
    this.forgetExclusive(who);
    if (bytes > 0) this.held.set(who, { bytes, residentAtTake: who.pid === undefined ? undefined : this.readings.resident(who.pid) });
    this.next();
  }

  /** The worker whose turn it is waits for memory another batch holds; false (nothing done) when it is not its turn. */
  wait(who: MemoryClaimant): boolean {
    if (this.turn?.who !== who) return false;
    const { releases } = this.turn;
    this.turn = undefined;
    // A batch ended while it planned: what it waited for may be free already.
    if (releases !== this.releases) this.asking.push(who);
    else this.parked.add(who);
    this.next();
    return true;
  }

  /** The worker's batch ended, or the worker died: what it held is free, and the waiting workers ask again. */
  release(who: MemoryClaimant): void {
    const index = this.asking.indexOf(who);
    if (index >= 0) this.asking.splice(index, 1);
    this.parked.delete(who);
    if (this.turn?.who === who) this.turn = undefined;
    this.forgetExclusive(who);
    if (this.held.delete(who)) {
      this.releases++;
      this.asking.push(...this.parked);
      this.parked.clear();
    }
    this.next();
  }

  /** Whether the worker waits for another batch's memory (its stall watchdog should not count that time). */
  isWaiting(who: MemoryClaimant): boolean {
    return this.parked.has(who) || this.asking.includes(who);
  }

  /** Whether the worker asked for exclusive work (see ask) and has not taken its memory yet. */
  isExclusive(who: MemoryClaimant): boolean {
    return this.exclusive.includes(who);
  }

  /** Bytes the running batches planned on, for the log line of a batch that waits for memory (pool.ts). */
  plannedBytes(): number {
    let total = 0;
    for (const { bytes } of this.held.values()) total += bytes;
    return total;
  }

  private next(): void {
    const who = this.turn ? undefined : this.asking.shift();
    if (!who) return;
    this.turn = { who, releases: this.releases };
    who.grantMemory(this.grant(who));
  }

  private forgetExclusive(who: MemoryClaimant): void {
    const index = this.exclusive.indexOf(who);
    if (index >= 0) this.exclusive.splice(index, 1);
  }

  private grant(who: MemoryClaimant): MemoryGrant {
    const alone = Math.min(this.readings.plannable(), this.limit);
    if (this.exclusive.length > 0 && this.exclusive[0] !== who) return { budget: 0, alone };
    let untaken = 0;
    let planned = 0;
    for (const [worker, held] of this.held) {
      if (worker === who) continue;
      untaken += this.untaken(worker, held);
      planned += held.bytes;
    }
    return { budget: Math.max(0, Math.min(alone - untaken, this.limit - planned)), alone };
  }

  /** What a running batch planned and its worker has not grown by yet (all of it where growth cannot be read). */
  private untaken(worker: MemoryClaimant, held: Held): number {
    const now = worker.pid === undefined ? undefined : this.readings.resident(worker.pid);
    const grown = now === undefined || held.residentAtTake === undefined ? 0 : Math.max(0, now - held.residentAtTake);
    return Math.max(0, held.bytes - grown);
  }
}
