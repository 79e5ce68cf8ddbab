/**
 * Tokenizer folders in the formats the real exports ship: CLIP as vocab.json + merges.txt (the "slow"
 * files) and/or tokenizer.json (the "fast" file), T5 as a Unigram tokenizer.json.
 */
import { BOS, CLIP_MAX_LENGTH, CLIP_SPLIT_PATTERN, EOS, type ClipVocabulary } from './clip-vocabulary.js';
import { json, type Files } from './files.js';
import { METASPACE, T5_EOS, T5_PAD, T5_UNK, type T5Vocabulary } from './t5-vocabulary.js';

/**
 * Which CLIP files a folder has: `slow` as the legacy diffusers exports (vocab.json, merges.txt,
 * special_tokens_map.json, old-style tokenizer_config.json), `slow+fast` as Optimum exports (those plus
 * tokenizer.json), `fast` as some Hub repos (tokenizer.json and tokenizer_config.json only).
 */
export type ClipTokenizerFormat = 'slow' | 'slow+fast' | 'fast';
/** SD 1.x pads with <|endoftext|>; SD 2.x, SD-Turbo and SDXL's second tokenizer with "!" (id 0). */
export type ClipPadToken = typeof EOS | '!';

interface TokenFlags {
  content: string;
  lstrip: false;
  normalized: boolean;
  rstrip: false;
  single_word: false;
}

function flags(content: string, normalized: boolean): TokenFlags {
  return { content, lstrip: false, normalized, rstrip: false, single_word: false };
}

export function clipTokenizerFiles(vocab: ClipVocabulary, pad: ClipPadToken, format: ClipTokenizerFormat): Files {
  const files: Files = {};
  const bos = flags(BOS, true);
  const eos = flags(EOS, true);
  // "!" is an ordinary byte token that is also declared special when it pads.
  const padSpecial = pad === '!' ? [{ id: 0, ...flags('!', false), special: true }] : [];
  if (format !== 'fast') {
    files['vocab.json'] = json(Object.fromEntries([...vocab.vocab].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))));
    files['merges.txt'] = ['#version: 0.2', ...vocab.merges].join('\n') + '\n';
    files['special_tokens_map.json'] = json({ bos_token: bos, eos_token: eos, pad_token: pad, unk_token: eos });
  }
  const common = {
    add_prefix_space: false,
    clean_up_tokenization_spaces: true,
    do_lower_case: true,
    errors: 'replace',
    model_max_length: CLIP_MAX_LENGTH,
    pad_token: pad,
    tokenizer_class: 'CLIPTokenizer',
  };
  files['tokenizer_config.json'] =
    format === 'slow'
      ? // The transformers 4.2x format of the original SD 1.5 export.
        json({
          ...common,
          bos_token: { __type: 'AddedToken', ...bos },
          eos_token: { __type: 'AddedToken', ...eos },
          unk_token: { __type: 'AddedToken', ...eos },
        })
      : json({
          ...common,
          added_tokens_decoder: Object.fromEntries([
            ...padSpecial.map(({ id, ...token }) => [String(id), token]),
            [String(vocab.bosId), { ...bos, special: true }],
            [String(vocab.eosId), { ...eos, special: true }],
          ]),
          bos_token: BOS,
          eos_token: EOS,
          unk_token: EOS,
        });
  if (format !== 'slow') {
    files['tokenizer.json'] = json({
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: [
        ...padSpecial,
        { id: vocab.bosId, ...flags(BOS, true), special: true },
        { id: vocab.eosId, ...flags(EOS, false), special: true },
      ],
      normalizer: {
        type: 'Sequence',
        normalizers: [{ type: 'NFC' }, { type: 'Replace', pattern: { Regex: '\\s+' }, content: ' ' }, { type: 'Lowercase' }],
      },
      pre_tokenizer: {
        type: 'Sequence',
        pretokenizers: [
          { type: 'Split', pattern: { Regex: CLIP_SPLIT_PATTERN }, behavior: 'Removed', invert: true },
          { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
        ],
      },
      post_processor: {
        type: 'RobertaProcessing',
        sep: [EOS, vocab.eosId],
        cls: [BOS, vocab.bosId],
        trim_offsets: false,
        add_prefix_space: false,
      },
      decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
      model: {
        type: 'BPE',
        dropout: null,
        unk_token: EOS,
        continuing_subword_prefix: '',
        end_of_word_suffix: '</w>',
        fuse_unk: false,
        byte_fallback: false,
        vocab: Object.fromEntries(vocab.vocab),
        merges: vocab.merges,
      },
    });
  }
  return files;
}

export function t5TokenizerFiles(vocab: T5Vocabulary, maxLength: number): Files {
  const specials = [T5_PAD, T5_EOS, T5_UNK].map((content) => ({ id: vocab.idOf(content)!, ...flags(content, false), special: true }));
  const metaspace = { type: 'Metaspace', replacement: METASPACE, prepend_scheme: 'always', split: true };
  return {
    'special_tokens_map.json': json({ eos_token: flags(T5_EOS, false), pad_token: flags(T5_PAD, false), unk_token: flags(T5_UNK, false) }),
    'tokenizer_config.json': json({
      added_tokens_decoder: Object.fromEntries(specials.map(({ id, ...token }) => [String(id), token])),
      clean_up_tokenization_spaces: true,
      eos_token: T5_EOS,
      extra_ids: 0,
      legacy: true,
      model_max_length: maxLength,
      pad_token: T5_PAD,
      tokenizer_class: 'T5Tokenizer',
      unk_token: T5_UNK,
    }),
    'tokenizer.json': json({
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: specials,
      normalizer: { type: 'NFKC' },
      pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'WhitespaceSplit' }, metaspace] },
      post_processor: {
        type: 'TemplateProcessing',
        single: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: T5_EOS, type_id: 0 } }],
        pair: [
          { Sequence: { id: 'A', type_id: 0 } },
          { SpecialToken: { id: T5_EOS, type_id: 0 } },
          { Sequence: { id: 'B', type_id: 0 } },
          { SpecialToken: { id: T5_EOS, type_id: 0 } },
        ],
        special_tokens: { [T5_EOS]: { id: T5_EOS, ids: [vocab.eosId], tokens: [T5_EOS] } },
      },
      decoder: metaspace,
      model: { type: 'Unigram', unk_id: vocab.unkId, vocab: vocab.pieces, byte_fallback: false },
    }),
  };
}
