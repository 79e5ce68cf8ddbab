import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { bytePairs } from '../src/tokenizers/clip-bpe.js';
import { findTokenizerSource } from '../src/tokenizers/files.js';
import { loadTokenizer } from '../src/tokenizers/load.js';
import { fixText } from '../src/tokenizers/ftfy.js';
import type { TextTokenizer } from '../src/tokenizers/tokenizer.js';

const here = path.dirname(fileURLToPath(import.meta.url));
// Real tokenizer files published with Stable Diffusion models; kept in shared/ beside the checkout.
const CLIP_DATA = path.resolve(here, '../../shared/data/clip-tokenizers');
const haveClipData = existsSync(CLIP_DATA);

const BOS = 49406;
const EOS = 49407;
const VOCAB_SIZE = 49408;
const ASTRONAUT = [BOS, 550, 18376, 6765, 320, 4558, EOS];

function padded(ids: number[], padId: number, length: number): number[] {
  return [...ids, ...new Array<number>(length - ids.length).fill(padId)];
}

if (!haveClipData) {
  console.warn(`skipping the CLIP tokenizer tests: ${CLIP_DATA} (the shared test data) is absent`);
}

describe.skipIf(!haveClipData)('CLIP BPE against real SD tokenizer files (needs ../shared/data/clip-tokenizers)', () => {
  const clip = (name: string) => path.join(CLIP_DATA, name);
  let sd15: TextTokenizer;
  let tempDir: string;

  beforeAll(async () => {
    sd15 = await loadTokenizer(clip('sd-1.5'));
    tempDir = await mkdtemp(path.join(tmpdir(), 'clip-bpe-'));
  });
  afterAll(async () => {
    await rm(tempDir, { recursive: true, force: true });
  });

  it('encodes the reference prompt and pads with eos for SD 1.5 (from tokenizer.json)', () => {
    expect(sd15.maxLength).toBe(77);
    expect(sd15.padId).toBe(EOS);
    expect(sd15.encode('An astronaut riding a horse')).toEqual(padded(ASTRONAUT, EOS, 77));
  });

  it("cleans text as transformers' CLIPTokenizer does with ftfy: entities, curly quotes, ligatures, full-width letters", () => {
    const same = (typed: string, plain: string) => expect(sd15.encode(typed), typed).toEqual(sd15.encode(plain));
    same('fish &amp; chips &quot;fresh&quot; &#233;t&eacute;', 'fish & chips "fresh" été');
    same('\u201cquoted\u201d and \u2018single\u2019', '"quoted" and \'single\'');
    same('\ufb01sh \ufb02ower', 'fish flower');
    same('\uff21\uff22\uff23\u3000\uff11\uff12', 'ABC 12');
    // ftfy leaves entities alone in text that may be HTML source (it has a '<').
    expect(sd15.encode('<b> &amp;')).not.toEqual(sd15.encode('<b> &'));
    // A bare '&' with no entity after it stays.
    same('salt & pepper', 'salt & pepper');
  });

  // Expected ids: transformers' CLIPTokenizer code (the slow tokenizer diffusers runs), re-run in Python
  // with ftfy 6.3.1 (6.1.1 gives the same) and `regex` on these sd-1.5 files, not written by hand.
  it.each([
    ['terminal colour escapes go, whole', 'red\u001b[31m fox\u001b[0m in \u001b[1;4mbold', [736, 3240, 530, 8911]],
    ['a vertical tab is removed, joining words (form feed stays a space)', 'a\u000bcat on a\u000cmat', [546, 536, 525, 320, 9063]],
    ['NUL, other C0 controls and DEL are removed', 'fox\u0000\u001c den\u007f cave', [3240, 1181, 9654]],
    ['a byte order mark is removed, also mid-text', '\ufeffa red\ufefffox', [320, 1893, 3240]],
    ['U+0085 is read as Windows-1252 "…", not as a line break', 'wait\u0085 what', [1885, 959, 768]],
    ['C1 controls are read as Windows-1252, undefined ones kept', '\u0093smart\u0094 \u0091quotes\u0092 \u0096 dash \u0080 \u0081', [257, 4115, 257, 262, 5808, 262, 1224, 10206, 6309, 126, 479]],
    ['object replacement, Arabic format controls and annotation marks are removed', 'obj\ufffcect \u206aarabic\u206f \ufff9anno\ufffb', [14115, 16709, 26871]],
    ['the ligature ŉ becomes "\'n" (ligatures before quotes)', 'ŉ ǈ', [262, 333, 32273]],
    ['full-width macron becomes space + combining macron', 'low\uffe3line', [1042, 136, 482, 1148]],
    ['soft hyphen, zero-width space and joiner stay', 'soft\u00adhyphen zero\u200bwidth 👩\u200d🚀', [3773, 22618, 1441, 745, 576, 5848, 9844, 23571, 26304, 13542]],
  ])('cleans control characters as ftfy does: %s', (_name, prompt, ids) => {
    expect(sd15.encode(prompt)).toEqual(padded([BOS, ...ids, EOS], EOS, 77));
  });

  // Expected ids: the same Python re-run (ftfy's fix_text gives the text in the comment).
  it.each([
    ['fixes until nothing changes', 'fish &amp;amp; chips \uff06amp; more', [2759, 261, 8855, 261, 750]], // fish & chips & more
    ['names in capitals', 'P&EACUTE;REZ &NTILDE;o &SZLIG; &GTRSIM; &EAcute;', [43167, 15192, 16574, 632, 261, 70, 635, 10740, 282, 261, 68, 19734, 282]], // PÉREZ Ño SS &GTRSIM; &EAcute;
    ['at most 24 letters', '&ClockwiseContourIntegral; &CounterClockwiseContourIntegral;', [17788, 366, 261, 10134, 19878, 820, 1846, 2710, 27018, 282]], // ∲ &CounterClockwiseContourIntegral;
    ['numbers: ";" kept as typed, controls and noncharacters dropped', 'a&#59;b &#x3b; c&#xFFFE;d e&#xFDD0;f g&#1;h &#65;&#x42;', [320, 5, 258, 276, 280, 282, 321, 5, 258, 343, 274, 321, 282, 4480, 1829, 790, 3937]], // a&#59;b &#x3b; cd ef gh AB
    ['lines before the first "<" only', 'fish &amp; chips\n<b>bold</b> &amp;', [2759, 261, 8855, 283, 321, 285, 8911, 34308, 321, 285, 261, 6259, 282]], // fish & chips\n<b>bold</b> &amp;
  ])('reads HTML references as ftfy does: %s', (_name, prompt, ids) => {
    expect(sd15.encode(prompt)).toEqual(padded([BOS, ...ids, EOS], EOS, 77));
  });

  it('unescapes a prompt escaped many times over in a bounded number of passes', () => {
    // ftfy goes on until nothing changes, one level of "&amp;" a pass: at the longest prompt, 8000
    // passes over it on the server's thread. Sixteen read any prompt a person escaped; the rest stays.
    const nested = (levels: number) => `&${'amp;'.repeat(levels)}x`;
    expect(fixText(nested(15))).toBe('&x');
    expect(fixText(nested(8000))).toBe(nested(8000 - 16));
  });

  it("skips U+0345 between words as transformers' case-insensitive pattern in Python's regex does", () => {
    // Expected ids from the same Python re-run: "a", "b", "ᾳ" (NFC composes it there), "ι", "x".
    expect(sd15.encode('a\u0345b \u1fb3 \u0399\u0345 x\u0345')).toEqual(padded([BOS, 320, 321, 157, 122, 367, 138, 373, 343, EOS], EOS, 77));
  });

  it("cleans SDXL's second tokenizer's text alike, after its added token '!' (id 0) is split off", async () => {
    // Expected ids as above, from the Python re-run on the same vocabulary (SDXL's tokenizer_2).
    const sdxl2 = await loadTokenizer(clip('sdxl-turbo-2'));
    const ids = [257, 2781, 0, 257, 8911, 0];
    expect(sdxl2.encode('\u0093wow!\u0094 \u001b[1mbold\u001b[0m!\ufeff')).toEqual(padded([BOS, ...ids, EOS], 0, 77));
  });

  it('gives the same ids from vocab.json + merges.txt as from tokenizer.json', async () => {
    // Only the legacy files, so that the loader cannot fall back on tokenizer.json.
    const legacy = path.join(tempDir, 'legacy');
    await mkdir(legacy);
    for (const file of ['vocab.json', 'merges.txt', 'tokenizer_config.json', 'special_tokens_map.json']) {
      await symlink(path.join(clip('sd-1.5'), file), path.join(legacy, file));
    }
    const fromLegacy = await loadTokenizer(legacy);
    expect(fromLegacy.padId).toBe(EOS);
    for (const prompt of ['An astronaut riding a horse', "it's a 3D render, 8k!!", 'Café façade — 東京 🚀']) {
      expect(fromLegacy.encode(prompt)).toEqual(sd15.encode(prompt));
    }
  });

  // Each folder's tokenizer_config.json names its pad token; these are what the shipped files say.
  // (Note: this sd-turbo copy names <|endoftext|>, unlike SD 2.x configs that name "!".)
  it.each([
    ['sd-1.5', EOS],
    ['sd-turbo', EOS],
    ['sdxl-turbo-1', EOS],
    ['sdxl-turbo-2', 0],
  ])('%s pads with the id its tokenizer_config names (%i)', async (name, padId) => {
    const tokenizer = await loadTokenizer(clip(name));
    expect(tokenizer.padId).toBe(padId);
    expect(tokenizer.encode('An astronaut riding a horse')).toEqual(padded(ASTRONAUT, padId, 77));
  });

  it('truncates long prompts to bos + 75 tokens + eos', () => {
    const row = sd15.encode('a photo of a cat sitting on a red chair, '.repeat(20));
    expect(row).toHaveLength(77);
    expect(row[0]).toBe(BOS);
    expect(row[76]).toBe(EOS);
    expect(row.slice(1, 76)).not.toContain(EOS);
    // A special token written past the limit is cut as the words are: a longer row fails the text encoder.
    expect(sd15.encode(`${'a photo of a cat sitting on a red chair, '.repeat(20)}<|endoftext|>`)).toEqual(row);
  });

  it('splits contractions, punctuation and digits as CLIP does', () => {
    const ids = (text: string) => {
      const row = sd15.encode(text);
      return row.slice(1, row.indexOf(EOS));
    };
    expect(ids("it's")).toEqual([...ids('it'), ...ids("'s")]);
    // Digits are single tokens: "2024" is four of them.
    expect(ids('2024')).toEqual([...ids('2'), ...ids('0'), ...ids('2'), ...ids('4')]);
    expect(ids('wow!!!')).toEqual([...ids('wow'), ...ids('!!!')]);
  });

  it('is case-insensitive and collapses whitespace', () => {
    expect(sd15.encode('AN ASTRONAUT Riding a HoRsE')).toEqual(sd15.encode('an astronaut riding a horse'));
    expect(sd15.encode('  An\tastronaut \n riding   a horse  ')).toEqual(padded(ASTRONAUT, EOS, 77));
  });

  it('maps special tokens written in the prompt to their ids', () => {
    expect(sd15.encode('<|startoftext|>horse<|endoftext|>').slice(0, 5)).toEqual([BOS, BOS, 4558, EOS, EOS]);
  });

  it('never throws on odd input and stays within the vocabulary', () => {
    const prompts = [
      '',
      '🚀🐱‍👤 emoji 👩🏽‍🚀',
      'Crème brûlée, naïve façade, Ångström',
      '東京タワー 北京 서울',
      'Ω≈ç√∫˜µ≤≥÷ \u0000\u0007 \uFEFF \uD800 lone surrogate',
      '"quotes" (parens) [brackets] {braces} <angles> #hash @at $dollar %percent ^caret &amp; *star',
      "don't we'll they're I'VE you'd she'll I'm",
    ];
    for (const prompt of prompts) {
      const row = sd15.encode(prompt);
      expect(row).toHaveLength(77);
      expect(row[0]).toBe(BOS);
      for (const id of row) expect(id >= 0 && id < VOCAB_SIZE && Number.isInteger(id)).toBe(true);
    }
    expect(sd15.encode('')).toEqual(padded([BOS, EOS], EOS, 77));
    // Emoji are not letters: they are byte-encoded, several bytes to a token at most.
    expect(sd15.encode('🚀').indexOf(EOS)).toBeGreaterThan(1);
  });

  it('encodes prompts of one very long word: 128,000 emoji (half a million bytes), 32,000 letters', () => {
    // The ids of a repeated symbol depend on the word's end only near the end: the first 75 are those of a shorter run.
    expect(sd15.encode('😀'.repeat(128_000))).toEqual(sd15.encode('😀'.repeat(1_000)));
    expect(sd15.encode('ab'.repeat(16_000))).toEqual(sd15.encode('ab'.repeat(1_000)));
  });

  it("merges byte pairs as GPT-2's BPE does, literally: the best-ranked pair's every occurrence, left to right, again and again", async () => {
    const lines = (await readFile(path.join(clip('sd-1.5'), 'merges.txt'), 'utf8')).split('\n').filter((line) => line && !line.startsWith('#version'));
    const ranks = new Map(lines.map((line, rank) => [line, rank]));
    /** The algorithm as transformers' CLIPTokenizer.bpe writes it: a pass over the word for every merge. */
    const literal = (word: string) => {
      let symbols = [...bytePairs(word, new Map())];
      for (;;) {
        let best = -1;
        for (let i = 0; i + 1 < symbols.length; i++) {
          const rank = ranks.get(`${symbols[i]} ${symbols[i + 1]}`);
          if (rank !== undefined && (best < 0 || rank < ranks.get(`${symbols[best]} ${symbols[best + 1]}`)!)) best = i;
        }
        if (best < 0) return symbols;
        const [left, right] = [symbols[best], symbols[best + 1]];
        const merged: string[] = [];
        for (let i = 0; i < symbols.length; i++) {
          if (symbols[i] === left && symbols[i + 1] === right) {
            merged.push(left + right);
            i++;
          } else {
            merged.push(symbols[i]);
          }
        }
        symbols = merged;
      }
    };
    // Words glued from pieces of real merges (so that many merges apply), letters, runs (a a a) and non-ASCII.
    let seed = 12345;
    const random = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) % n);
    const pieces = [...lines.slice(0, 3000).flatMap((line) => line.replace(/<\/w>/g, '').split(' ')), 'a', 'aa', 'é', '東', '😀', 'zzzz'];
    const words = Array.from({ length: 400 }, () => Array.from({ length: 1 + random(12) }, () => pieces[random(pieces.length)]).join(''));
    words.push('a'.repeat(3000), 'ab'.repeat(1500), 'mississippi'.repeat(200));
    for (const word of words) expect(bytePairs(word, ranks), word.slice(0, 40)).toEqual(literal(word));
  });
});

describe('SentencePiece Unigram (T5) from a small tokenizer.json', () => {
  const PAD = 0;
  const END = 1;
  const UNK = 2;
  const pieces: Array<[string, number]> = [
    ['<pad>', 0],
    ['</s>', 0],
    ['<unk>', 0],
    ['\u2581', -2], // 3
    ['a', -3], // 4
    ['b', -3], // 5
    ['c', -3], // 6
    ['\u2581a', -2], // 7
    ['\u2581ab', -4], // 8
    ['ab', -2.5], // 9
    ['bc', -1], // 10
    ['abc', -5], // 11
  ];
  const tokenizerJson = {
    version: '1.0',
    added_tokens: [
      { id: PAD, content: '<pad>', special: true },
      { id: END, content: '</s>', special: true },
      { id: UNK, content: '<unk>', special: true },
    ],
    normalizer: {
      type: 'Sequence',
      normalizers: [
        { type: 'NFKC' },
        { type: 'Lowercase' },
        { type: 'Strip', strip_left: true, strip_right: true },
        { type: 'Replace', pattern: { Regex: ' {2,}' }, content: ' ' },
      ],
    },
    pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'always', split: true },
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
    },
    model: { type: 'Unigram', unk_id: UNK, vocab: pieces, byte_fallback: false },
  };
  const tokenizerConfig = { eos_token: '</s>', pad_token: '<pad>', unk_token: '<unk>', model_max_length: 512 };

  let dir: string;
  let t5: TextTokenizer;

  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 't5-unigram-'));
    await writeFile(path.join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson));
    await writeFile(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tokenizerConfig));
    t5 = await loadTokenizer(dir, { maxLength: 256 });
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  const content = (text: string) => {
    const row = t5.encode(text);
    return row.slice(0, row.indexOf(END));
  };

  it('picks the best-scoring segmentation, not the longest match', () => {
    // "▁abc": ▁a + bc scores -3; the greedy ▁ab + c would score -7, ▁ + abc -7.
    expect(content('abc')).toEqual([7, 10]);
  });

  it('appends </s> and pads with <pad> to the requested length', () => {
    const row = t5.encode('abc');
    expect(t5.maxLength).toBe(256);
    expect(t5.padId).toBe(PAD);
    expect(row).toHaveLength(256);
    expect(row.slice(0, 4)).toEqual([7, 10, END, PAD]);
    expect(row.slice(3).every((id) => id === PAD)).toBe(true);
  });

  it('follows the normalizer: NFKC, lowercase, strip, collapsed spaces', () => {
    expect(content('  ＡＢＣ    abc ')).toEqual([7, 10, 7, 10]);
  });

  it('maps unknown characters to <unk>, one for a run of them', () => {
    expect(content('x')).toEqual([3, UNK]);
    expect(content('axyzb')).toEqual([7, UNK, 5]);
    expect(content('a 🚀')).toEqual([7, 3, UNK]);
  });

  it('truncates long text but keeps </s> last', () => {
    const row = t5.encode('abc '.repeat(300));
    expect(row).toHaveLength(256);
    expect(row[255]).toBe(END);
    expect(row.slice(0, 255)).not.toContain(PAD);
  });

  it('encodes empty text as </s> and padding', () => {
    expect(t5.encode('')).toEqual(padded([END], PAD, 256));
  });

  it('uses model_max_length when the caller gives no length', async () => {
    expect((await loadTokenizer(dir)).maxLength).toBe(512);
  });

  it('reads the legacy Metaspace form (add_prefix_space) after WhitespaceSplit', async () => {
    const legacyDir = await mkdtemp(path.join(tmpdir(), 't5-legacy-'));
    try {
      const legacy = {
        ...tokenizerJson,
        normalizer: { type: 'Precompiled', precompiled_charsmap: '' },
        pre_tokenizer: {
          type: 'Sequence',
          pretokenizers: [
            { type: 'WhitespaceSplit' },
            { type: 'Metaspace', replacement: '\u2581', add_prefix_space: true },
          ],
        },
      };
      await writeFile(path.join(legacyDir, 'tokenizer.json'), JSON.stringify(legacy));
      const tokenizer = await loadTokenizer(legacyDir, { maxLength: 8 });
      expect(tokenizer.encode(' abc\t abc ')).toEqual([7, 10, 7, 10, END, PAD, PAD, PAD]);
    } finally {
      await rm(legacyDir, { recursive: true, force: true });
    }
  });
});

describe('loadTokenizer', () => {
  const escaped = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'partial-tokenizer-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it.each([
    ['vocab.json', 'merges.txt'],
    ['merges.txt', 'vocab.json'],
  ])('names the missing file when a CLIP folder has only %s', async (present, absent) => {
    await writeFile(path.join(dir, present), present === 'vocab.json' ? '{"a</w>": 0}' : '#version: 0.2\n');
    await expect(loadTokenizer(dir)).rejects.toThrow(new RegExp(`${escaped(dir)}.*${escaped(absent)} is missing`));
    await expect(findTokenizerSource(dir)).rejects.toMatchObject({ partial: true });
  });

  it('names tokenizer.json and spiece.model when a T5 folder has neither', async () => {
    await writeFile(path.join(dir, 'tokenizer_config.json'), JSON.stringify({ tokenizer_class: 'T5Tokenizer' }));
    await writeFile(path.join(dir, 'added_tokens.json'), JSON.stringify({ '<extra_id_0>': 32099 }));
    await expect(loadTokenizer(dir)).rejects.toThrow(
      new RegExp(`${escaped(dir)}.*tokenizer\\.json.*spiece\\.model`),
    );
  });

  it('names spiece.model when it is not a SentencePiece model', async () => {
    await writeFile(path.join(dir, 'spiece.model'), Buffer.from([0x0a, 0xff, 0xff, 0x01]));
    await expect(loadTokenizer(dir)).rejects.toThrow(/spiece\.model/);
  });

  it('names the folder and the files it looked for when there is no tokenizer', async () => {
    await expect(loadTokenizer(dir)).rejects.toThrow(
      new RegExp(`${escaped(dir)}.*tokenizer\\.json.*vocab\\.json.*merges\\.txt.*spiece\\.model`),
    );
    await expect(findTokenizerSource(dir)).rejects.toMatchObject({ partial: false });
  });
});
