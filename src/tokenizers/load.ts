import path from 'node:path';
import { readJsonIfPresent, readTextIfPresent } from '../util/files.js';
import { ClipBpeTokenizer } from './clip-bpe.js';
import { UnigramTokenizer } from './t5-unigram.js';
import type { TextTokenizer } from './tokenizer.js';

/**
 * Builds the tokenizer a model folder's `tokenizer/` (or `tokenizer_2/`) describes. All file reading
 * and interpretation of the Hugging Face config files happens here; the tokenizers get plain data.
 */

export interface LoadTokenizerOptions {
  /** Row length; wins over `model_max_length` (FLUX schnell takes 256 T5 tokens where the file says 512). */
  maxLength?: number;
}

interface SpecialTokenNames {
  bos?: string;
  eos?: string;
  unk?: string;
  pad?: string;
}

interface TokenizerSettings {
  names: SpecialTokenNames;
  modelMaxLength?: number;
}

interface TokenizerJson {
  model?: {
    type?: string;
    vocab?: unknown;
    merges?: unknown;
    unk_id?: number | null;
    unk_token?: string | null;
    end_of_word_suffix?: string | null;
  };
  normalizer?: unknown;
  pre_tokenizer?: unknown;
  added_tokens?: Array<{ id: number; content: string }>;
  padding?: { pad_token?: string } | null;
}

const TOKENIZER_JSON = 'tokenizer.json';
const VOCAB_JSON = 'vocab.json';
const MERGES_TXT = 'merges.txt';
const TOKENIZER_CONFIG = 'tokenizer_config.json';
const SPECIAL_TOKENS_MAP = 'special_tokens_map.json';

// transformers writes int(1e30) as `model_max_length` when a tokenizer has no limit of its own.
const MAX_SENSIBLE_LENGTH = 100_000;

export async function loadTokenizer(dir: string, options: LoadTokenizerOptions = {}): Promise<TextTokenizer> {
  const settings = await readTokenizerSettings(dir);
  const maxLength = options.maxLength ?? settings.modelMaxLength;

  const tokenizerJson = (await readJsonIfPresent(path.join(dir, TOKENIZER_JSON))) as TokenizerJson | undefined;
  if (tokenizerJson) return fromTokenizerJson(dir, tokenizerJson, settings.names, maxLength);

  const vocab = await readJsonIfPresent(path.join(dir, VOCAB_JSON));
  const merges = await readTextIfPresent(path.join(dir, MERGES_TXT));
  if (vocab !== undefined && merges !== undefined) {
    const { bos, eos, unk, pad } = settings.names;
    return new ClipBpeTokenizer(vocabMap(vocab, path.join(dir, VOCAB_JSON)), parseMergesTxt(merges), {
      maxLength,
      bosToken: bos,
      eosToken: eos,
      unkToken: unk,
      padToken: pad,
    });
  }
  throw new Error(
    `No tokenizer in ${dir}: looked for ${TOKENIZER_JSON}, or ${VOCAB_JSON} together with ${MERGES_TXT}`,
  );
}

function fromTokenizerJson(
  dir: string,
  json: TokenizerJson,
  names: SpecialTokenNames,
  maxLength: number | undefined,
): TextTokenizer {
  const file = path.join(dir, TOKENIZER_JSON);
  const model = json.model ?? {};
  const addedTokens = new Map((json.added_tokens ?? []).map((token) => [token.content, token.id] as const));
  // transformers' fast tokenizers take the pad token from the file's padding section when the config
  // files name none.
  const padToken = names.pad ?? json.padding?.pad_token;

  switch (model.type) {
    case 'BPE': {
      if (model.end_of_word_suffix !== '</w>') {
        throw new Error(`${file}: only CLIP's BPE (end_of_word_suffix "</w>") is supported`);
      }
      const vocab = vocabMap(model.vocab, file);
      for (const [content, id] of addedTokens) vocab.set(content, id);
      return new ClipBpeTokenizer(vocab, parseMergeList(model.merges, file), {
        maxLength,
        bosToken: names.bos,
        eosToken: names.eos,
        unkToken: names.unk ?? model.unk_token ?? undefined,
        padToken,
      });
    }
    case 'Unigram': {
      if (!Array.isArray(model.vocab)) throw new Error(`${file}: model.vocab is not a list of [piece, score]`);
      return new UnigramTokenizer(
        {
          pieces: model.vocab as Array<[string, number]>,
          unkId: model.unk_id,
          normalizer: json.normalizer,
          preTokenizer: json.pre_tokenizer,
          addedTokens,
        },
        { maxLength, eosToken: names.eos, unkToken: names.unk, padToken },
      );
    }
    default:
      throw new Error(
        `${file}: unsupported tokenizer model type ${JSON.stringify(model.type)} (BPE or Unigram expected)`,
      );
  }
}

/**
 * Special token names and `model_max_length` from tokenizer_config.json and special_tokens_map.json.
 * The map wins where both name a token, as transformers applies it over the config.
 */
async function readTokenizerSettings(dir: string): Promise<TokenizerSettings> {
  const config = asRecord(await readJsonIfPresent(path.join(dir, TOKENIZER_CONFIG)));
  const map = asRecord(await readJsonIfPresent(path.join(dir, SPECIAL_TOKENS_MAP)));
  const name = (key: string) => tokenContent(map[key]) ?? tokenContent(config[key]);
  const length = config.model_max_length;
  const sensible =
    typeof length === 'number' && Number.isInteger(length) && length > 0 && length <= MAX_SENSIBLE_LENGTH;
  return {
    names: { bos: name('bos_token'), eos: name('eos_token'), unk: name('unk_token'), pad: name('pad_token') },
    modelMaxLength: sensible ? length : undefined,
  };
}

/** A special token is written either as its text or as an AddedToken object `{content, ...}`. */
function tokenContent(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  const content = (value as { content?: unknown } | null | undefined)?.content;
  return typeof content === 'string' ? content : undefined;
}

function asRecord(value: unknown): Record<string, unknown> {
  return typeof value === 'object' && value !== null ? (value as Record<string, unknown>) : {};
}

function vocabMap(vocab: unknown, file: string): Map<string, number> {
  if (typeof vocab !== 'object' || vocab === null || Array.isArray(vocab)) {
    throw new Error(`${file}: the vocabulary is not a token -> id object`);
  }
  return new Map(Object.entries(vocab as Record<string, number>));
}

/** merges.txt: an optional `#version` header, then one "left right" pair a line. */
function parseMergesTxt(text: string): Array<[string, string]> {
  const lines = text.split(/\r?\n/).filter((line) => line !== '' && !line.startsWith('#version'));
  return lines.map(splitMerge);
}

/** tokenizer.json merges: "left right" strings in older files, [left, right] pairs in newer ones. */
function parseMergeList(merges: unknown, file: string): Array<[string, string]> {
  if (!Array.isArray(merges)) throw new Error(`${file}: model.merges is not a list`);
  return merges.map((merge: unknown) =>
    Array.isArray(merge) ? [String(merge[0]), String(merge[1])] : splitMerge(String(merge)),
  );
}

function splitMerge(line: string): [string, string] {
  // Byte-level symbols never contain a space, so the first space is the separator.
  const at = line.indexOf(' ');
  return [line.slice(0, at), line.slice(at + 1)];
}
