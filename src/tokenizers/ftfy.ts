import { decodeHTMLStrict } from 'entities';

/**
 * The parts of ftfy's `fix_text` (defaults) that change what CLIP's tokenizer sees in a typed prompt:
 * transformers' CLIPTokenizer runs ftfy before BPE, and Stable Diffusion's tokenizer files were used
 * that way. Mojibake repair (text decoded with the wrong codec) is left out: a prompt typed into an
 * API arrives as the UTF-8 it was written in.
 */

/** ftfy's uncurl_quotes: curly, reversed and low-9 quotes and the modifier apostrophe become ASCII. */
const SINGLE_QUOTES = /[\u02bc\u2018-\u201b]/gu;
const DOUBLE_QUOTES = /[\u201c-\u201f]/gu;

/** ftfy's fix_latin_ligatures: ligatures of Latin letters spelled out (not the ones languages need, like æ). */
const LIGATURES: Record<string, string> = {
  Ĳ: 'IJ', ĳ: 'ij', ŉ: 'ʼn', Ǳ: 'DZ', ǲ: 'Dz', ǳ: 'dz', Ǆ: 'DŽ', ǅ: 'Dž', ǆ: 'dž', Ǉ: 'LJ', ǈ: 'Lj', ǉ: 'lj', Ǌ: 'NJ', ǋ: 'Nj', ǌ: 'nj',
  ﬀ: 'ff', ﬁ: 'fi', ﬂ: 'fl', ﬃ: 'ffi', ﬄ: 'ffl', ﬅ: 'ſt', ﬆ: 'st',
};
const LIGATURE_PATTERN = new RegExp(`[${Object.keys(LIGATURES).join('')}]`, 'gu');

/** ftfy's fix_character_width: full-width ASCII and the ideographic space become ASCII, half-width katakana full-width. */
const WIDTH_VARIANTS = /[\u3000\uff01-\uffef]/gu;

export function fixText(text: string): string {
  // ftfy's "auto" rule: text that has a '<' may be HTML source, whose entities are meant literally.
  const unescaped = text.includes('<') ? text : decodeHTMLStrict(text);
  return unescaped
    .replace(SINGLE_QUOTES, "'")
    .replace(DOUBLE_QUOTES, '"')
    .replace(LIGATURE_PATTERN, (c) => LIGATURES[c])
    .replace(WIDTH_VARIANTS, (c) => {
      const narrow = c.normalize('NFKC');
      return [...narrow].length === 1 ? narrow : c;
    })
    .normalize('NFC');
}
