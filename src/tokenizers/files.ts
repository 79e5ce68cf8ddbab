import path from 'node:path';
import { exists } from '../util/files.js';

/**
 * Which files a tokenizer folder loads from, and what it lacks when it cannot: the error names the
 * missing file and the folder, so that a partial copy is not mistaken for a damaged one.
 */

export const TOKENIZER_JSON = 'tokenizer.json';
export const VOCAB_JSON = 'vocab.json';
export const MERGES_TXT = 'merges.txt';
export const SPIECE_MODEL = 'spiece.model';
/** What the loader also reads where a folder has them: special token names, added tokens, model_max_length (load.ts). */
export const TOKENIZER_CONFIG = 'tokenizer_config.json';
export const SPECIAL_TOKENS_MAP = 'special_tokens_map.json';
export const ADDED_TOKENS_JSON = 'added_tokens.json';

/** Every file a tokenizer folder is read from: installs keep each of them. */
export const TOKENIZER_FILES: readonly string[] = [TOKENIZER_JSON, VOCAB_JSON, MERGES_TXT, SPIECE_MODEL, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, ADDED_TOKENS_JSON];

/** tokenizer.json (any model); CLIP's vocab.json + merges.txt; T5's SentencePiece model. */
export type TokenizerSource = typeof TOKENIZER_JSON | typeof VOCAB_JSON | typeof SPIECE_MODEL;

export class TokenizerFilesError extends Error {
  constructor(
    readonly dir: string,
    /** Some of the files were there: a companion is missing rather than the whole tokenizer. */
    readonly partial: boolean,
    problem: string,
  ) {
    super(`${dir}: ${problem}`);
    this.name = 'TokenizerFilesError';
  }
}

export async function findTokenizerSource(dir: string): Promise<TokenizerSource> {
  if (await exists(path.join(dir, TOKENIZER_JSON))) return TOKENIZER_JSON;
  const vocab = await exists(path.join(dir, VOCAB_JSON));
  const merges = await exists(path.join(dir, MERGES_TXT));
  if (vocab && merges) return VOCAB_JSON;
  if (vocab || merges) {
    const [present, absent] = vocab ? [VOCAB_JSON, MERGES_TXT] : [MERGES_TXT, VOCAB_JSON];
    throw new TokenizerFilesError(dir, true, `${absent} is missing (${present} is there, and the CLIP tokenizer needs both)`);
  }
  if (await exists(path.join(dir, SPIECE_MODEL))) return SPIECE_MODEL;
  throw new TokenizerFilesError(
    dir,
    false,
    `no tokenizer: looked for ${TOKENIZER_JSON}, ${VOCAB_JSON} together with ${MERGES_TXT} (CLIP), or ${SPIECE_MODEL} (T5)`,
  );
}
