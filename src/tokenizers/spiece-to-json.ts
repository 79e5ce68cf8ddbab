import { PieceType, type SentencePieceModel } from './sentencepiece-model.js';

/**
 * The tokenizer.json that transformers' SpmConverter (convert_slow_tokenizer.py) makes of a
 * spiece.model when T5TokenizerFast is loaded from a folder without tokenizer.json, so that both
 * kinds of folder run through the same library with the same settings.
 */

export interface AddedTokenSpec {
  id: number;
  content: string;
  special: boolean;
  lstrip?: boolean;
  rstrip?: boolean;
}

export interface ConversionOptions {
  /** tokenizer_config.json `add_prefix_space`; the model's `add_dummy_prefix` when absent. */
  addPrefixSpace?: boolean;
  /** tokenizer_config.json `legacy`: transformers only prepends `▁` to the first piece of text unless it is true. */
  legacy?: boolean;
  /** Added tokens the config files declare (T5's `<extra_id_N>`), besides the model's own control pieces. */
  addedTokens: readonly AddedTokenSpec[];
}

const METASPACE = '\u2581';

export function sentencePieceToTokenizerJson(model: SentencePieceModel, options: ConversionOptions): object {
  const addPrefixSpace = options.addPrefixSpace ?? model.addDummyPrefix;
  const prependScheme = !addPrefixSpace ? 'never' : options.legacy === false ? 'first' : 'always';

  // Control, unknown and user-defined pieces are added tokens, so that typing one gives its id.
  const ownTokens: AddedTokenSpec[] = [];
  model.pieces.forEach(({ piece, type }, id) => {
    if (type === PieceType.control || type === PieceType.unknown || type === PieceType.userDefined) {
      ownTokens.push({ id, content: piece, special: type !== PieceType.userDefined });
    }
  });
  const byId = new Map([...ownTokens, ...options.addedTokens].map((token) => [token.id, token] as const));
  const addedTokens = [...byId.values()]
    .sort((a, b) => a.id - b.id)
    .map((token) => ({
      single_word: false,
      normalized: false,
      ...token,
      lstrip: token.lstrip ?? false,
      rstrip: token.rstrip ?? false,
    }));

  const charsmap = model.precompiledCharsmap;
  return {
    version: '1.0',
    added_tokens: addedTokens,
    normalizer: {
      type: 'Sequence',
      normalizers: [
        ...(charsmap.length ? [{ type: 'Precompiled', precompiled_charsmap: Buffer.from(charsmap).toString('base64') }] : []),
        { type: 'Strip', strip_left: false, strip_right: true },
        { type: 'Replace', pattern: { Regex: ' {2,}' }, content: METASPACE },
      ],
    },
    pre_tokenizer: { type: 'Metaspace', replacement: METASPACE, prepend_scheme: prependScheme, split: true },
    // T5Tokenizer appends `</s>` itself (see t5.ts), as the converter's template would.
    post_processor: null,
    decoder: { type: 'Metaspace', replacement: METASPACE, prepend_scheme: prependScheme, split: true },
    model: {
      type: 'Unigram',
      unk_id: model.unkId,
      vocab: model.pieces.map(({ piece, score }) => [piece, score]),
      byte_fallback: model.byteFallback,
    },
  };
}
