import { MAX_PROMPT_LENGTH } from '../api/wire.js';
import type { ModelEntry } from '../models/registry.js';
import { loadModelTokenizer } from '../models/model-tokenizer.js';
import type { TextTokenizer } from '../tokenizers/tokenizer.js';

/**
 * Counts a prompt's tokens with the model's own tokenizer (its `tokenizer/` folder), for the `usage` of
 * gpt-image responses. The count is the prompt's full length in tokens, without the start/end markers
 * and padding, and not cut at the 77 (CLIP) or 256/512 (T5) tokens the text encoder reads.
 */

/**
 * Rows long enough that no prompt is truncated: CLIP's byte-level BPE makes at most one token per UTF-8
 * byte (at most 3 per UTF-16 unit, 4 with lower-casing's rare expansions), plus its two markers.
 */
const UNTRUNCATED_LENGTH = 4 * MAX_PROMPT_LENGTH + 2;

interface LoadedTokenizer {
  tokenizer: TextTokenizer;
  /** Tokens of the empty prompt that are not padding: the markers every row carries. */
  markers: number;
}

/**
 * Tokens before the trailing padding. Where the pad token is the end marker (SD 1.x's CLIP) the end
 * marker is trimmed too; subtracting the empty prompt's count, trimmed alike, leaves the prompt's own.
 */
function unpadded(tokenizer: TextTokenizer, text: string): number {
  const row = tokenizer.encode(text);
  let end = row.length;
  while (end > 0 && row[end - 1] === tokenizer.padId) end--;
  return end;
}

export class PromptTokenCounter {
  /** Per model folder; a folder whose contents were replaced (a new version) loads again. */
  private readonly loaded = new Map<string, { version: string; tokenizer: Promise<LoadedTokenizer> }>();

  async count(model: ModelEntry, prompt: string): Promise<number> {
    const { tokenizer, markers } = await this.tokenizerOf(model);
    return unpadded(tokenizer, prompt) - markers;
  }

  private tokenizerOf(model: ModelEntry): Promise<LoadedTokenizer> {
    const { dir, tokenizer: folder } = model.layout;
    const cached = this.loaded.get(dir);
    if (cached?.version === model.version) return cached.tokenizer;
    const tokenizer = loadModelTokenizer(dir, folder, { maxLength: UNTRUNCATED_LENGTH }).then((loaded) => ({ tokenizer: loaded, markers: unpadded(loaded, '') }));
    // A failed load is not kept: the next request tries again.
    tokenizer.catch(() => {
      if (this.loaded.get(dir)?.tokenizer === tokenizer) this.loaded.delete(dir);
    });
    this.loaded.set(dir, { version: model.version, tokenizer });
    return tokenizer;
  }
}
