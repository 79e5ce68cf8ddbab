import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { readJsonIfPresent } from '../util/files.js';
import { ClipBpeTokenizer } from './clip-bpe.js';
import { ADDED_TOKENS_JSON, findTokenizerSource, MERGES_TXT, SPECIAL_TOKENS_MAP, SPIECE_MODEL, TOKENIZER_CONFIG, TOKENIZER_JSON, VOCAB_JSON } from './files.js';
import { parseSentencePieceModel } from './sentencepiece-model.js';
import { type AddedTokenSpec, sentencePieceToTokenizerJson } from './spiece-to-json.js';
import { T5Tokenizer } from './t5.js';
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
  /** tokenizer_config.json as it is. */
  config: Record<string, unknown>;
  /** Added tokens the config files declare: `added_tokens_decoder`, or the older added_tokens.json. */
  addedTokens: AddedTokenSpec[];
}

interface TokenizerJson {
  model?: {
    type?: string;
    vocab?: unknown;
    merges?: unknown;
    unk_token?: string | null;
    end_of_word_suffix?: string | null;
  };
  added_tokens?: Array<{ id: number; content: string }>;
  padding?: { pad_token?: string } | null;
}

// transformers writes int(1e30) as `model_max_length` when a tokenizer has no limit of its own.
const MAX_SENSIBLE_LENGTH = 100_000;

export async function loadTokenizer(dir: string, options: LoadTokenizerOptions = {}): Promise<TextTokenizer> {
  const source = await findTokenizerSource(dir);
  const settings = await readTokenizerSettings(dir);
  const maxLength = options.maxLength ?? settings.modelMaxLength;
  const { bos, eos, unk, pad } = settings.names;

  if (source === TOKENIZER_JSON) return fromTokenizerJson(dir, settings, maxLength);
  if (source === SPIECE_MODEL) {
    const file = path.join(dir, SPIECE_MODEL);
    const model = await parseSentencePieceModel(await readFile(file), file);
    const json = sentencePieceToTokenizerJson(model, {
      addPrefixSpace: optionalBoolean(settings.config.add_prefix_space),
      legacy: optionalBoolean(settings.config.legacy),
      addedTokens: settings.addedTokens,
    });
    return new T5Tokenizer(json, settings.config, { maxLength, eosToken: eos, padToken: pad });
  }
  const vocab = await readJsonIfPresent(path.join(dir, VOCAB_JSON));
  const merges = await readFile(path.join(dir, MERGES_TXT), 'utf8');
  return new ClipBpeTokenizer(vocabMap(vocab, path.join(dir, VOCAB_JSON)), parseMergesTxt(merges), {
    maxLength,
    bosToken: bos,
    eosToken: eos,
    unkToken: unk,
    padToken: pad,
    addedTokens: new Map(settings.addedTokens.map((token) => [token.content, token.id])),
  });
}

async function fromTokenizerJson(
  dir: string,
  settings: TokenizerSettings,
  maxLength: number | undefined,
): Promise<TextTokenizer> {
  const file = path.join(dir, TOKENIZER_JSON);
  const json = (await readJsonIfPresent(file)) as TokenizerJson;
  const { names } = settings;
  const model = json.model ?? {};
  // transformers' fast tokenizers take the pad token from the file's padding section when the config
  // files name none.
  const padToken = names.pad ?? json.padding?.pad_token;

  switch (model.type) {
    case 'BPE': {
      if (model.end_of_word_suffix !== '</w>') {
        throw new Error(`${file}: only CLIP's BPE (end_of_word_suffix "</w>") is supported`);
      }
      const addedTokens = new Map((json.added_tokens ?? []).map((token) => [token.content, token.id] as const));
      const vocab = vocabMap(model.vocab, file);
      for (const [content, id] of addedTokens) vocab.set(content, id);
      return new ClipBpeTokenizer(vocab, parseMergeList(model.merges, file), {
        maxLength,
        bosToken: names.bos,
        eosToken: names.eos,
        unkToken: names.unk ?? model.unk_token ?? undefined,
        padToken,
        addedTokens,
      });
    }
    case 'Unigram': {
      const withConfig = { ...json, added_tokens: withConfigAttributes(json.added_tokens ?? [], settings.addedTokens) };
      return new T5Tokenizer(withConfig, settings.config, { maxLength, eosToken: names.eos, padToken });
    }
    default:
      throw new Error(
        `${file}: unsupported tokenizer model type ${JSON.stringify(model.type)} (BPE or Unigram expected)`,
      );
  }
}

/**
 * transformers re-adds the config's `added_tokens_decoder` over tokenizer.json's tokens, so its
 * lstrip/rstrip win (T5's `<extra_id_N>` eat the spaces around them), as when converting spiece.model.
 */
function withConfigAttributes(tokens: NonNullable<TokenizerJson['added_tokens']>, fromConfig: readonly AddedTokenSpec[]) {
  const byId = new Map(fromConfig.map((token) => [token.id, token] as const));
  return tokens.map((token) => {
    const config = byId.get(token.id);
    return config?.content === token.content ? { ...token, lstrip: config.lstrip, rstrip: config.rstrip } : token;
  });
}

/**
 * Special token names, added tokens and `model_max_length` from tokenizer_config.json,
 * special_tokens_map.json and added_tokens.json. The map wins where both name a token, as transformers
 * applies it over the config.
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
    config,
    addedTokens: await readAddedTokens(dir, config),
  };
}

/** `added_tokens_decoder` ({id: {content, lstrip, rstrip, special}}) of newer configs, else added_tokens.json ({content: id}). */
async function readAddedTokens(dir: string, config: Record<string, unknown>): Promise<AddedTokenSpec[]> {
  const decoder = asRecord(config.added_tokens_decoder);
  const fromDecoder = Object.entries(decoder).flatMap(([id, value]): AddedTokenSpec[] => {
    const token = asRecord(value);
    const content = tokenContent(token);
    if (content === undefined || !/^\d+$/.test(id)) return [];
    return [{ id: Number(id), content, special: token.special === true, lstrip: token.lstrip === true, rstrip: token.rstrip === true }];
  });
  if (fromDecoder.length) return fromDecoder;
  const legacy = asRecord(await readJsonIfPresent(path.join(dir, ADDED_TOKENS_JSON)));
  return Object.entries(legacy).flatMap(([content, id]) =>
    typeof id === 'number' && Number.isInteger(id) ? [{ id, content, special: false }] : [],
  );
}

function optionalBoolean(value: unknown): boolean | undefined {
  return typeof value === 'boolean' ? value : undefined;
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
