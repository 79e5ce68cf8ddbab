/**
 * Our own small SentencePiece Unigram vocabulary for the T5 encoder of the FLUX families, laid out
 * like T5's: <pad> = 0, </s> = 1, <unk> = 2, then "▁word" pieces (lower-case and capitalised, since T5
 * does not lower-case), then "▁" and single printable ASCII characters so that any text segments.
 */
import { VOCABULARY_WORDS } from './concepts.js';

export const T5_PAD = '<pad>';
export const T5_EOS = '</s>';
export const T5_UNK = '<unk>';
export const METASPACE = '▁';

/** Log-probabilities: a whole word always beats spelling it out, which beats <unk>. */
const SPECIAL_SCORE = 0;
const WORD_SCORE = -3;
const SPACE_SCORE = -5;
const CHAR_SCORE = -8;
const UNK_SCORE = -20;

/** The pieces that spell a whole word: lower-case and capitalised. */
function wordPieces(word: string): string[] {
  return [METASPACE + word, METASPACE + word[0].toUpperCase() + word.slice(1)];
}

export class T5Vocabulary {
  /** [piece, score]; a piece's id is its index. */
  readonly pieces: ReadonlyArray<readonly [string, number]>;
  readonly padId = 0;
  readonly eosId = 1;
  readonly unkId = 2;
  private readonly ids: Map<string, number>;
  private readonly longest: number;

  constructor(words: readonly string[]) {
    const pieces: Array<readonly [string, number]> = [
      [T5_PAD, SPECIAL_SCORE],
      [T5_EOS, SPECIAL_SCORE],
      [T5_UNK, SPECIAL_SCORE],
    ];
    for (const word of words) pieces.push(...wordPieces(word).map((piece) => [piece, WORD_SCORE] as const));
    pieces.push([METASPACE, SPACE_SCORE]);
    for (let code = 0x21; code <= 0x7e; code++) pieces.push([String.fromCharCode(code), CHAR_SCORE]);
    this.pieces = pieces;
    this.ids = new Map(pieces.map(([piece], id) => [piece, id]));
    this.longest = Math.max(...pieces.map(([piece]) => piece.length));
  }

  get size(): number {
    return this.pieces.length;
  }

  idOf(piece: string): number | undefined {
    return this.ids.get(piece);
  }

  /** The ids of a vocabulary word's whole-word pieces. */
  wordIds(word: string): number[] {
    return wordPieces(word).map((piece) => this.ids.get(piece)!);
  }

  /**
   * What the written tokenizer.json means for `text`: NFKC, split on whitespace, "▁" before each word,
   * best-scoring segmentation (Viterbi, unknown characters fused into one <unk>), then </s>, truncated
   * and padded with <pad> to `maxLength`.
   */
  encode(text: string, maxLength: number): number[] {
    const ids: number[] = [];
    for (const word of text.normalize('NFKC').split(/\s+/).filter(Boolean)) ids.push(...this.segment(METASPACE + word));
    const row = [...ids.slice(0, maxLength - 1), this.eosId];
    while (row.length < maxLength) row.push(this.padId);
    return row;
  }

  private segment(chunk: string): number[] {
    // best[i]: the best score of chunk[0..i) and the piece id that ends there.
    const best: Array<{ score: number; start: number; id: number }> = [{ score: 0, start: 0, id: -1 }];
    for (let end = 1; end <= chunk.length; end++) {
      let pick = { score: best[end - 1].score + UNK_SCORE, start: end - 1, id: this.unkId };
      for (let start = Math.max(0, end - this.longest); start < end; start++) {
        const id = this.ids.get(chunk.slice(start, end));
        if (id === undefined || id <= this.unkId) continue;
        const score = best[start].score + this.pieces[id][1];
        if (score > pick.score) pick = { score, start, id };
      }
      best[end] = pick;
    }
    const ids: number[] = [];
    for (let end = chunk.length; end > 0; end = best[end].start) {
      const id = best[end].id;
      if (!(id === this.unkId && ids[0] === this.unkId)) ids.unshift(id);
    }
    return ids;
  }
}

/** The one vocabulary all reference T5 tokenizers share. */
export function referenceT5Vocabulary(): T5Vocabulary {
  return new T5Vocabulary(VOCABULARY_WORDS);
}
