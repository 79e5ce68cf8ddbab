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

// Bounded so that a server fed endless distinct prompts does not grow without limit.
const CACHE_LIMIT = 10_000;

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
      else content.push(...this.textIds(segment, room - content.length));
    }
    const row = [this.bosId, ...content.slice(0, room), this.eosId];
    while (row.length < this.maxLength) row.push(this.padId);
    return row;
  }

  /** Ids of text without added tokens, up to `room` of them (or a word's worth more). */
  private textIds(text: string, room: number): number[] {
    // CLIP's cleaning as transformers does it: ftfy's fix_text (NFC among it), whitespace runs
    // collapsed and trimmed, lowercase.
    const cleaned = fixText(text).replace(/\s+/gu, ' ').trim().toLowerCase();
    const ids: number[] = [];
    for (const match of cleaned.matchAll(WORD_PATTERN)) {
      if (ids.length >= room) break;
      ids.push(...this.wordIds(match[0]));
    }
    return ids;
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
    for (const symbol of this.bpe(word)) {
      const id = this.vocab.get(symbol) ?? this.unkId;
      if (id !== undefined) ids.push(id);
    }
    if (this.cache.size >= CACHE_LIMIT) this.cache.clear();
    this.cache.set(word, ids);
    return ids;
  }

  /** Splits one word into vocabulary symbols by applying the best-ranked merge until none applies. */
  private bpe(word: string): string[] {
    let symbols = Array.from(utf8.encode(word), (byte) => BYTE_TO_CHAR[byte]);
    symbols[symbols.length - 1] += END_OF_WORD;

    while (symbols.length > 1) {
      let bestRank = Infinity;
      let bestAt = -1;
      for (let i = 0; i + 1 < symbols.length; i++) {
        const rank = this.ranks.get(`${symbols[i]} ${symbols[i + 1]}`);
        if (rank !== undefined && rank < bestRank) {
          bestRank = rank;
          bestAt = i;
        }
      }
      if (bestAt < 0) break;

      // Merge every occurrence of the chosen pair, scanning left to right.
      const left = symbols[bestAt];
      const right = symbols[bestAt + 1];
      const merged: string[] = [];
      for (let i = 0; i < symbols.length; i++) {
        if (symbols[i] === left && symbols[i + 1] === right) {
          merged.push(left + right);
          i++;
        } else {
          merged.push(symbols[i]);
        }
      }
      symbols = merged;
    }
    return symbols;
  }
}
