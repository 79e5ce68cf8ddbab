import { AddedTokenSplitter } from './added-tokens.js';
import type { TextTokenizer } from './tokenizer.js';
import { fixText } from './ftfy.js';

/**
 * CLIP's byte-level BPE, as `CLIPTokenizer` in huggingface/transformers runs it: every word is spelled
 * in bytes (so no input is ever out of vocabulary), merged by rank, and the last symbol of a word
 * carries the `</w>` suffix.
 *
 * Our own code rather than @huggingface/tokenizers: that library only loads tokenizer.json, which
 * Optimum's exports do not ship (vocab.json + merges.txt only), and gives other ids than transformers
 * on the tokenizer.json published with SD 1.5.
 */

export interface ClipBpeOptions {
  /** Row length; CLIP text encoders take 77 (bos + 75 tokens + eos). */
  maxLength?: number;
  bosToken?: string;
  eosToken?: string;
  /** SD 1.x and CLIP-L pad with eos; SD 2.x and SDXL's second tokenizer pad with "!" (id 0). */
  padToken?: string;
  /** Only used if a byte symbol is missing from a damaged vocabulary; without it the symbol is dropped. */
  unkToken?: string;
  /** Added tokens (content -> id) that a prompt may contain, such as SD 2's pad "!" (id 0). */
  addedTokens?: ReadonlyMap<string, number>;
}

const DEFAULT_MAX_LENGTH = 77;
const DEFAULT_BOS = '<|startoftext|>';
const DEFAULT_EOS = '<|endoftext|>';
const END_OF_WORD = '</w>';

// CLIP's own pattern. Special tokens come first: the added-token split only finds them as written,
// and transformers' BPE cache maps them to their ids after lower-casing too. The flags make `\p{..}`
// work and mirror CLIP's re.IGNORECASE.
const WORD_PATTERN =
  /<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+/giu;

/**
 * U+0345 COMBINING GREEK YPOGEGRAMMENI where NFC left it alone: in Python's `regex`, which runs CLIP's
 * pattern case-insensitively in transformers, no alternative takes it (it folds to the letter ι, yet
 * the letter class does not match it), so it only parts the words around it (seen with regex
 * 2022.10.31). JavaScript's case-insensitive letter class takes it, so it is made a space first.
 */
const UNMATCHED = /\u0345/gu;

// Bounded so that a server fed endless distinct prompts does not grow without limit.
const CACHE_LIMIT = 10_000;
/** Longer words are not cached (see wordIds). */
const CACHED_WORD_LENGTH = 64;

/**
 * GPT-2's reversible byte -> character table: printable bytes stand for themselves, the others are
 * moved above U+00FF so that no symbol is whitespace or a control character.
 */
const BYTE_TO_CHAR: readonly string[] = (() => {
  const table: string[] = new Array(256);
  let shifted = 0;
  for (let byte = 0; byte < 256; byte++) {
    const printable = (byte >= 0x21 && byte <= 0x7e) || (byte >= 0xa1 && byte <= 0xac) || byte >= 0xae;
    table[byte] = String.fromCharCode(printable ? byte : 256 + shifted++);
  }
  return table;
})();

const utf8 = new TextEncoder();

export class ClipBpeTokenizer implements TextTokenizer {
  readonly maxLength: number;
  readonly padId: number;
  private readonly bosId: number;
  private readonly eosId: number;
  private readonly unkId: number | undefined;
  /** Special tokens written in the prompt itself, looked up before BPE. */
  private readonly specialIds: ReadonlyMap<string, number>;
  private readonly addedTokens: AddedTokenSplitter;
  /** "left right" -> merge priority (lower merges first). */
  private readonly ranks = new Map<string, number>();
  private readonly cache = new Map<string, number[]>();

  /**
   * @param vocab token -> id, including any added tokens.
   * @param merges merge rules in priority order, as in merges.txt or tokenizer.json `model.merges`.
   */
  constructor(
    private readonly vocab: ReadonlyMap<string, number>,
    merges: ReadonlyArray<readonly [string, string]>,
    options: ClipBpeOptions = {},
  ) {
    this.maxLength = options.maxLength ?? DEFAULT_MAX_LENGTH;
    if (!Number.isInteger(this.maxLength) || this.maxLength < 2) {
      throw new Error(`CLIP tokenizer maxLength must be an integer of at least 2 (bos + eos), got ${this.maxLength}`);
    }
    const bosToken = options.bosToken ?? DEFAULT_BOS;
    const eosToken = options.eosToken ?? DEFAULT_EOS;
    this.bosId = this.requireId(bosToken, 'bos');
    this.eosId = this.requireId(eosToken, 'eos');
    this.padId = options.padToken === undefined ? this.eosId : this.requireId(options.padToken, 'pad');
    this.unkId = options.unkToken === undefined ? undefined : vocab.get(options.unkToken);
    this.specialIds = new Map([
      [bosToken, this.bosId],
      [eosToken, this.eosId],
    ]);
    // transformers makes the named special tokens added tokens too, whatever the config lists.
    const padToken: ReadonlyArray<[string, number]> = options.padToken === undefined ? [] : [[options.padToken, this.padId]];
    this.addedTokens = new AddedTokenSplitter(new Map([...(options.addedTokens ?? []), ...this.specialIds, ...padToken]));
    merges.forEach(([left, right], rank) => this.ranks.set(`${left} ${right}`, rank));
  }

  encode(text: string): number[] {
    const room = this.maxLength - 2;
    const content: number[] = [];
    for (const segment of this.addedTokens.split(text)) {
      if (content.length >= room) break;
      if (typeof segment === 'number') content.push(segment);
      else this.textIds(segment, content, room);
    }
    const row = [this.bosId, ...content, this.eosId];
    while (row.length < this.maxLength) row.push(this.padId);
    return row;
  }

  /**
   * Appends the ids of text without added tokens to `ids` until it holds `room` (transformers truncates
   * the whole row the same way). One at a time: a word of emoji runs to over 100,000 ids, too many to
   * spread into push()'s arguments.
   */
  private textIds(text: string, ids: number[], room: number): void {
    // CLIP's cleaning as transformers does it: ftfy's fix_text (NFC among it), whitespace runs
    // collapsed and trimmed, lowercase. transformers' `\s` (Python's `regex`: Unicode White_Space)
    // takes U+0085 and not U+FEFF, JavaScript's the other way round; fixText leaves neither.
    const cleaned = fixText(text).replace(/\s+/gu, ' ').trim().toLowerCase().replace(UNMATCHED, ' ');
    for (const match of cleaned.matchAll(WORD_PATTERN)) {
      for (const id of this.wordIds(match[0])) {
        if (ids.length >= room) return;
        ids.push(id);
      }
    }
  }

  private requireId(token: string, role: string): number {
    const id = this.vocab.get(token);
    if (id === undefined) {
      throw new Error(`CLIP tokenizer: ${role} token ${JSON.stringify(token)} is not in the vocabulary`);
    }
    return id;
  }

  private wordIds(word: string): number[] {
    const special = this.specialIds.get(word);
    if (special !== undefined) return [special];
    const cached = this.cache.get(word);
    if (cached) return cached;

    const ids: number[] = [];
    for (const symbol of bytePairs(word, this.ranks)) {
      const id = this.vocab.get(symbol) ?? this.unkId;
      if (id !== undefined) ids.push(id);
    }
    // Prompts' words are short; a long one (a prompt without spaces) is not worth its memory.
    if (word.length > CACHED_WORD_LENGTH) return ids;
    if (this.cache.size >= CACHE_LIMIT) this.cache.clear();
    this.cache.set(word, ids);
    return ids;
  }
}

/**
 * Splits one word into vocabulary symbols as GPT-2's and CLIP's BPE does: again and again, merge every
 * occurrence of the best-ranked adjacent pair, left to right. Done literally that is a pass over the
 * word per merge, and a prompt of one 32,000-letter word took seconds; here the pairs wait in a heap by
 * (rank, position) and each round takes all of the best rank's, in order, so a word costs
 * n log n. The symbols are a linked list of the word's bytes; a pair in the heap whose symbols changed
 * since it was pushed (a version per symbol) is skipped.
 */
export function bytePairs(word: string, ranks: ReadonlyMap<string, number>): string[] {
  const symbols = Array.from(utf8.encode(word), (byte) => BYTE_TO_CHAR[byte]);
  symbols[symbols.length - 1] += END_OF_WORD;
  const n = symbols.length;
  const next = Int32Array.from({ length: n }, (_, i) => (i + 1 < n ? i + 1 : -1));
  const prev = Int32Array.from({ length: n }, (_, i) => i - 1);
  const version = new Int32Array(n);
  const alive = new Uint8Array(n).fill(1);
  const heap = new PairHeap();
  const push = (left: number) => {
    const right = next[left];
    if (right < 0) return;
    const rank = ranks.get(`${symbols[left]} ${symbols[right]}`);
    if (rank !== undefined) heap.push({ rank, left, right, leftVersion: version[left], rightVersion: version[right] });
  };
  for (let i = 0; i + 1 < n; i++) push(i);

  while (heap.size > 0) {
    // One round: every pair of the best rank, in word order; a merge cannot make another pair of that
    // rank (the merged symbol is longer than either side), and pairs it makes wait for the next rounds.
    const rank = heap.peek().rank;
    const merged: number[] = [];
    while (heap.size > 0 && heap.peek().rank === rank) {
      const { left, right, leftVersion, rightVersion } = heap.pop();
      // Stale: a symbol merged since, or the pair overlapping one merged just before it (a a a).
      if (!alive[left] || !alive[right] || next[left] !== right || version[left] !== leftVersion || version[right] !== rightVersion) continue;
      symbols[left] += symbols[right];
      version[left]++;
      alive[right] = 0;
      next[left] = next[right];
      if (next[right] >= 0) prev[next[right]] = left;
      merged.push(left);
    }
    for (const at of merged) {
      if (!alive[at]) continue;
      if (prev[at] >= 0) push(prev[at]);
      push(at);
    }
  }
  const out: string[] = [];
  for (let i = 0; i >= 0; i = next[i]) out.push(symbols[i]);
  return out;
}

interface Pair {
  rank: number;
  /** The left symbol's position in the word (its first byte's), which orders pairs of one rank. */
  left: number;
  right: number;
  leftVersion: number;
  rightVersion: number;
}

/** A binary min-heap of pairs by (rank, position). */
class PairHeap {
  private readonly items: Pair[] = [];

  get size(): number {
    return this.items.length;
  }

  peek(): Pair {
    return this.items[0];
  }

  push(pair: Pair): void {
    const items = this.items;
    items.push(pair);
    for (let i = items.length - 1; i > 0; ) {
      const parent = (i - 1) >> 1;
      if (!before(items[i], items[parent])) break;
      [items[i], items[parent]] = [items[parent], items[i]];
      i = parent;
    }
  }

  pop(): Pair {
    const items = this.items;
    const top = items[0];
    const last = items.pop()!;
    if (items.length === 0) return top;
    items[0] = last;
    for (let i = 0; ; ) {
      const [l, r] = [2 * i + 1, 2 * i + 2];
      let least = i;
      if (l < items.length && before(items[l], items[least])) least = l;
      if (r < items.length && before(items[r], items[least])) least = r;
      if (least === i) break;
      [items[i], items[least]] = [items[least], items[i]];
      i = least;
    }
    return top;
  }
}

const before = (a: Pair, b: Pair) => a.rank < b.rank || (a.rank === b.rank && a.left < b.left);
