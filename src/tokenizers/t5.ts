import { Tokenizer } from '@huggingface/tokenizers';
import type { TextTokenizer } from './tokenizer.js';

/**
 * T5's SentencePiece Unigram (FLUX's second text encoder), run by @huggingface/tokenizers, the
 * Hugging Face JS port of the Rust tokenizers: it loads tokenizer.json as T5TokenizerFast does and
 * gives transformers' ids on the real T5 files. Truncation, `</s>` and padding are done here as
 * transformers does them with `padding="max_length", truncation=True`.
 */

export interface T5Options {
  /** Row length: 256 for FLUX schnell, 512 for FLUX dev. */
  maxLength?: number;
  eosToken?: string;
  padToken?: string;
}

const DEFAULT_MAX_LENGTH = 512;
const DEFAULT_EOS = '</s>';
const DEFAULT_PAD = '<pad>';

export class T5Tokenizer implements TextTokenizer {
  readonly maxLength: number;
  readonly padId: number;
  private readonly eosId: number;
  private readonly tokenizer: Tokenizer;

  /**
   * @param tokenizerJson a tokenizer.json, or one made from spiece.model
   * @param config tokenizer_config.json (the library reads a few switches from it)
   */
  constructor(tokenizerJson: object, config: object, options: T5Options = {}) {
    this.maxLength = options.maxLength ?? DEFAULT_MAX_LENGTH;
    if (!Number.isInteger(this.maxLength) || this.maxLength < 1) {
      throw new Error(`T5 tokenizer maxLength must be a positive integer, got ${this.maxLength}`);
    }
    // The library wants every section present; the Rust serializer writes absent ones as null, some
    // older or hand-made files leave them out.
    const sections = { normalizer: null, pre_tokenizer: null, post_processor: null, decoder: null };
    this.tokenizer = new Tokenizer({ ...sections, ...tokenizerJson }, config);
    const idOf = (token: string, role: string): number => {
      const id = this.tokenizer.token_to_id(token);
      if (id === undefined) throw new Error(`T5 tokenizer: ${role} token ${JSON.stringify(token)} is not in the vocabulary`);
      return id;
    };
    this.eosId = idOf(options.eosToken ?? DEFAULT_EOS, 'eos');
    this.padId = idOf(options.padToken ?? DEFAULT_PAD, 'pad');
  }

  encode(text: string): number[] {
    // T5's template is "$A </s>": `</s>` is appended here so that truncation never drops it.
    const content = this.tokenizer.encode(text, { add_special_tokens: false }).ids;
    const row = [...content.slice(0, this.maxLength - 1), this.eosId];
    while (row.length < this.maxLength) row.push(this.padId);
    return row;
  }
}
