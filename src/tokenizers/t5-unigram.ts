import type { TextTokenizer } from './tokenizer.js';

/**
 * SentencePiece Unigram as huggingface/tokenizers runs a `tokenizer.json` of model type `Unigram`
 * (T5, used as FLUX's second text encoder): normalizer, pre-tokenizer, then per word the segmentation
 * with the highest total log-probability, then `</s>` appended.
 */

export interface UnigramSpec {
  /** tokenizer.json `model.vocab`: [piece, log-probability], indexed by id. */
  pieces: ReadonlyArray<readonly [string, number]>;
  /** tokenizer.json `model.unk_id`. */
  unkId?: number | null;
  /** tokenizer.json `normalizer` and `pre_tokenizer` sections, interpreted here. */
  normalizer?: unknown;
  preTokenizer?: unknown;
  /** tokenizer.json `added_tokens`, which may give special tokens ids of their own. */
  addedTokens?: ReadonlyMap<string, number>;
}

export interface UnigramOptions {
  /** Row length: 256 for FLUX schnell, 512 for FLUX dev. */
  maxLength?: number;
  eosToken?: string;
  padToken?: string;
  unkToken?: string;
}

const DEFAULT_MAX_LENGTH = 512;
const DEFAULT_EOS = '</s>';
const DEFAULT_PAD = '<pad>';
const DEFAULT_UNK = '<unk>';
const METASPACE = '\u2581';

// SentencePiece's score for a character no piece covers: below every real piece, so an unknown is
// only chosen where nothing else fits.
const UNK_PENALTY = 10;

// Bounded so that a server fed endless distinct prompts does not grow without limit.
const CACHE_LIMIT = 10_000;

type Normalize = (text: string) => string;
type PreTokenize = (words: string[]) => string[];

export class UnigramTokenizer implements TextTokenizer {
  readonly maxLength: number;
  readonly padId: number;
  private readonly eosId: number;
  private readonly unkId: number;
  private readonly pieceIds = new Map<string, number>();
  private readonly scores: Float64Array;
  private readonly unkScore: number;
  /** Longest piece in code points: how far ahead the segmentation has to look. */
  private readonly longestPiece: number;
  private readonly normalize: Normalize;
  private readonly preTokenize: PreTokenize;
  private readonly cache = new Map<string, number[]>();

  constructor(spec: UnigramSpec, options: UnigramOptions = {}) {
    this.maxLength = options.maxLength ?? DEFAULT_MAX_LENGTH;
    if (!Number.isInteger(this.maxLength) || this.maxLength < 1) {
      throw new Error(`Unigram tokenizer maxLength must be a positive integer, got ${this.maxLength}`);
    }
    if (spec.pieces.length === 0) throw new Error('Unigram tokenizer: the vocabulary is empty');

    this.scores = Float64Array.from(spec.pieces, ([, score]) => score);
    let longest = 1;
    spec.pieces.forEach(([piece], id) => {
      this.pieceIds.set(piece, id);
      longest = Math.max(longest, Array.from(piece).length);
    });
    this.longestPiece = longest;
    this.unkScore = this.scores.reduce((min, score) => Math.min(min, score)) - UNK_PENALTY;

    const idOf = (token: string, role: string): number => {
      const id = spec.addedTokens?.get(token) ?? this.pieceIds.get(token);
      if (id === undefined) {
        throw new Error(`Unigram tokenizer: ${role} token ${JSON.stringify(token)} is not in the vocabulary`);
      }
      return id;
    };
    this.eosId = idOf(options.eosToken ?? DEFAULT_EOS, 'eos');
    this.padId = idOf(options.padToken ?? DEFAULT_PAD, 'pad');
    this.unkId = spec.unkId ?? idOf(options.unkToken ?? DEFAULT_UNK, 'unk');
    this.normalize = buildNormalizer(spec.normalizer);
    this.preTokenize = buildPreTokenizer(spec.preTokenizer);
  }

  encode(text: string): number[] {
    const room = this.maxLength - 1;
    const content: number[] = [];
    const normalized = this.normalize(text);
    const words = normalized === '' ? [] : this.preTokenize([normalized]);
    for (const word of words) {
      if (content.length >= room) break;
      content.push(...this.wordIds(word));
    }
    // Truncate the text, never the `</s>` the encoder expects at the end.
    const row = [...content.slice(0, room), this.eosId];
    while (row.length < this.maxLength) row.push(this.padId);
    return row;
  }

  private wordIds(word: string): number[] {
    const cached = this.cache.get(word);
    if (cached) return cached;
    const ids = this.segment(word);
    if (this.cache.size >= CACHE_LIMIT) this.cache.clear();
    this.cache.set(word, ids);
    return ids;
  }

  /**
   * Viterbi over code points. Ties keep the path found first (earlier start, then shorter piece),
   * matching huggingface/tokenizers so that ids agree with the reference exactly.
   */
  private segment(word: string): number[] {
    const chars = Array.from(word);
    const n = chars.length;
    const bestScore = new Float64Array(n + 1);
    const startOf = new Int32Array(n + 1).fill(-1);
    const idAt = new Int32Array(n + 1);

    const offer = (start: number, end: number, id: number, score: number) => {
      const candidate = bestScore[start] + score;
      if (startOf[end] < 0 || candidate > bestScore[end]) {
        bestScore[end] = candidate;
        startOf[end] = start;
        idAt[end] = id;
      }
    };

    // Every position is reachable (each character is covered by a one-character piece or by unk), so
    // bestScore[start] is always a real path score here.
    for (let start = 0; start < n; start++) {
      let piece = '';
      let coversOneChar = false;
      for (let end = start + 1; end <= Math.min(n, start + this.longestPiece); end++) {
        piece += chars[end - 1];
        const id = this.pieceIds.get(piece);
        if (id === undefined) continue;
        offer(start, end, id, this.scores[id]);
        if (end === start + 1) coversOneChar = true;
      }
      if (!coversOneChar) offer(start, start + 1, this.unkId, this.unkScore);
    }

    const ids: number[] = [];
    for (let end = n; end > 0; end = startOf[end]) {
      const id = idAt[end];
      // SentencePiece fuses a run of unknown characters into a single unk.
      if (id === this.unkId && ids[ids.length - 1] === this.unkId) continue;
      ids.push(id);
    }
    return ids.reverse();
  }
}

interface ComponentConfig {
  type?: string;
  [key: string]: unknown;
}

function asComponent(config: unknown, what: string): ComponentConfig {
  if (typeof config !== 'object' || config === null) throw new Error(`tokenizer.json: ${what} is not an object`);
  return config as ComponentConfig;
}

function buildNormalizer(config: unknown): Normalize {
  if (config === undefined || config === null) return (text) => text;
  const c = asComponent(config, 'normalizer');
  switch (c.type) {
    case 'Sequence': {
      const steps = (c.normalizers as unknown[]).map(buildNormalizer);
      return (text) => steps.reduce((acc, step) => step(acc), text);
    }
    case 'NFC':
    case 'NFD':
    case 'NFKC':
    case 'NFKD': {
      const form = c.type;
      return (text) => text.normalize(form);
    }
    case 'Lowercase':
      return (text) => text.toLowerCase();
    case 'Strip': {
      const left = c.strip_left !== false;
      const right = c.strip_right !== false;
      return (text) => {
        const stripped = left ? text.trimStart() : text;
        return right ? stripped.trimEnd() : stripped;
      };
    }
    case 'Replace': {
      const pattern = c.pattern as { String?: string; Regex?: string };
      const content = String(c.content ?? '');
      if (pattern.Regex !== undefined) {
        const regex = new RegExp(pattern.Regex, 'gu');
        return (text) => text.replace(regex, () => content);
      }
      const literal = String(pattern.String ?? '');
      return (text) => (literal === '' ? text : text.replaceAll(literal, content));
    }
    case 'Precompiled':
      // The real thing is SentencePiece's compiled `nmt_nfkc` character map (a trie in base64). We
      // approximate it by NFKC plus turning every whitespace run into one space, which is what that
      // map and SentencePiece's default whitespace cleanup do to ordinary prompts; rare characters
      // the map treats specially (control characters, some symbols) may come out differently.
      return (text) => text.normalize('NFKC').replace(/\s+/gu, ' ');
    default:
      throw new Error(`tokenizer.json: unsupported normalizer type ${JSON.stringify(c.type)}`);
  }
}

function buildPreTokenizer(config: unknown): PreTokenize {
  if (config === undefined || config === null) return (words) => words;
  const c = asComponent(config, 'pre_tokenizer');
  switch (c.type) {
    case 'Sequence': {
      const steps = (c.pretokenizers as unknown[]).map(buildPreTokenizer);
      return (words) => steps.reduce((acc, step) => step(acc), words);
    }
    case 'WhitespaceSplit':
      return (words) => words.flatMap((word) => word.split(/\s+/u).filter((part) => part !== ''));
    case 'Metaspace':
      return metaspace(c);
    default:
      throw new Error(`tokenizer.json: unsupported pre_tokenizer type ${JSON.stringify(c.type)}`);
  }
}

/**
 * Spaces become `▁`, a `▁` is prepended where the scheme asks, and each word is split before every
 * `▁` so that pieces start at word boundaries.
 */
function metaspace(c: ComponentConfig): PreTokenize {
  const replacement = typeof c.replacement === 'string' ? c.replacement : METASPACE;
  // Older files say `add_prefix_space` (default true) where newer ones say `prepend_scheme`.
  const legacyScheme = c.add_prefix_space === false ? 'never' : 'always';
  const scheme = typeof c.prepend_scheme === 'string' ? c.prepend_scheme : legacyScheme;
  const split = c.split !== false;
  return (words) =>
    words.flatMap((word, index) => {
      let text = word.replaceAll(' ', replacement);
      // "first" prepends only at the start of the text, i.e. to the first word.
      const prepend = scheme === 'always' || (scheme === 'first' && index === 0);
      if (prepend && !text.startsWith(replacement)) text = replacement + text;
      if (!split) return [text];
      const parts: string[] = [];
      let from = 0;
      for (let at = text.indexOf(replacement, 1); at > 0; at = text.indexOf(replacement, at + replacement.length)) {
        parts.push(text.slice(from, at));
        from = at;
      }
      parts.push(text.slice(from));
      return parts.filter((part) => part !== '');
    });
}
