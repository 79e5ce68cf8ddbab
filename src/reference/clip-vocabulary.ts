/**
 * Our own small CLIP-style byte-level BPE vocabulary, laid out like the real one: ids 0..255 are the
 * byte alphabet in CLIP's bytes_to_unicode order (so "!" is 0), 256..511 the same with "</w>", then one
 * token per merge, then <|startoftext|> and <|endoftext|>. Any text tokenizes: words without merges
 * fall back to single characters.
 */
import { VOCABULARY_WORDS } from './concepts.js';

export const BOS = '<|startoftext|>';
export const EOS = '<|endoftext|>';
const END_OF_WORD = '</w>';
/** CLIP's pre-tokenisation pattern (the Split step of the real tokenizer.json). */
export const CLIP_SPLIT_PATTERN = "'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+";
export const CLIP_MAX_LENGTH = 77;

/**
 * GPT-2/CLIP's bytes_to_unicode: printable bytes stand for themselves, the others get U+0100 onwards.
 * `order` is the vocabulary order: printable bytes ascending, then the others ascending.
 */
function bytesToUnicode(): { byteChar: string[]; order: string[] } {
  const isPrintable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const byteChar: string[] = [];
  const printable: string[] = [];
  const others: string[] = [];
  for (let b = 0; b < 256; b++) {
    if (isPrintable(b)) printable.push((byteChar[b] = String.fromCharCode(b)));
    else others.push((byteChar[b] = String.fromCharCode(256 + others.length)));
  }
  return { byteChar, order: [...printable, ...others] };
}

const { byteChar: BYTE_CHAR, order: ALPHABET } = bytesToUnicode();

/** CLIP's BPE on one pre-tokenised word (already in alphabet characters). */
function bpe(word: string, ranks: ReadonlyMap<string, number>): string[] {
  const chars = [...word];
  let pieces = [...chars.slice(0, -1), chars[chars.length - 1] + END_OF_WORD];
  while (pieces.length > 1) {
    let best = -1;
    let bestRank = Infinity;
    for (let i = 0; i < pieces.length - 1; i++) {
      const rank = ranks.get(`${pieces[i]} ${pieces[i + 1]}`);
      if (rank !== undefined && rank < bestRank) {
        bestRank = rank;
        best = i;
      }
    }
    if (best < 0) break;
    const [a, b] = [pieces[best], pieces[best + 1]];
    const merged: string[] = [];
    for (let i = 0; i < pieces.length; i++) {
      if (i < pieces.length - 1 && pieces[i] === a && pieces[i + 1] === b) {
        merged.push(a + b);
        i++;
      } else merged.push(pieces[i]);
    }
    pieces = merged;
  }
  return pieces;
}

export class ClipVocabulary {
  /** Merges in rank order, each "left right". */
  readonly merges: readonly string[];
  /** Token -> id, in id order. */
  readonly vocab: ReadonlyMap<string, number>;
  readonly bosId: number;
  readonly eosId: number;
  private readonly ranks: Map<string, number>;

  /**
   * Learns the merges that make each word one token: tokenize the word with the merges so far and add
   * a merge of its first two pieces until it is whole. New merges rank last, so they never change how
   * earlier words split.
   */
  constructor(words: readonly string[]) {
    this.ranks = new Map();
    const merges: string[] = [];
    const vocab = new Map<string, number>();
    ALPHABET.forEach((ch) => vocab.set(ch, vocab.size));
    ALPHABET.forEach((ch) => vocab.set(ch + END_OF_WORD, vocab.size));
    for (const word of words) {
      for (let pieces = bpe(word, this.ranks); pieces.length > 1; pieces = bpe(word, this.ranks)) {
        const merge = `${pieces[0]} ${pieces[1]}`;
        this.ranks.set(merge, merges.length);
        merges.push(merge);
        if (!vocab.has(pieces[0] + pieces[1])) vocab.set(pieces[0] + pieces[1], vocab.size);
      }
    }
    this.bosId = vocab.size;
    vocab.set(BOS, this.bosId);
    this.eosId = vocab.size;
    vocab.set(EOS, this.eosId);
    this.merges = merges;
    this.vocab = vocab;
  }

  get size(): number {
    return this.vocab.size;
  }

  /** The id of a vocabulary word's whole-word token. */
  wordId(word: string): number {
    const id = this.vocab.get(word + END_OF_WORD);
    if (id === undefined) throw new Error(`"${word}" is not a whole word of the vocabulary`);
    return id;
  }

  /**
   * What the written tokenizer files mean for `text`: bos, tokens, eos, truncated and padded to
   * CLIP_MAX_LENGTH with `padId`. Tests use it as the reference for feeding the text encoders.
   */
  encode(text: string, padId: number): number[] {
    const normalised = text.normalize('NFC').replace(/\s+/g, ' ').toLowerCase();
    const ids: number[] = [];
    for (const match of normalised.matchAll(new RegExp(CLIP_SPLIT_PATTERN, 'gu'))) {
      const word = [...new TextEncoder().encode(match[0])].map((b) => BYTE_CHAR[b]).join('');
      for (const piece of bpe(word, this.ranks)) ids.push(this.vocab.get(piece)!);
    }
    const row = [this.bosId, ...ids.slice(0, CLIP_MAX_LENGTH - 2), this.eosId];
    while (row.length < CLIP_MAX_LENGTH) row.push(padId);
    return row;
  }
}

/** The one vocabulary all reference CLIP tokenizers share. */
export function referenceClipVocabulary(): ClipVocabulary {
  return new ClipVocabulary(VOCABULARY_WORDS);
}
