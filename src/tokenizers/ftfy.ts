import { replaceCodePoint } from 'entities/decode';
import { unescapeHtml } from './ftfy-html.js';

/**
 * The parts of ftfy's `fix_text` (6.x, defaults) that change what CLIP's tokenizer sees in a typed
 * prompt: transformers' CLIPTokenizer runs ftfy before BPE when ftfy is installed, and Stable
 * Diffusion's tokenizer files were used that way. Mojibake repair (text decoded with the wrong codec)
 * is left out: a prompt typed into an API arrives as the UTF-8 it was written in.
 *
 * Two of ftfy's steps are left out because they cannot change CLIP's ids: fix_line_breaks (CR, CRLF,
 * U+2028 and U+2029 become "\n", whitespace before and after; U+0085 never reaches it, see C1_CONTROLS)
 * and fix_surrogates (a lone surrogate becomes U+FFFD, the very bytes UTF-8 encoding gives it here).
 */

/**
 * ftfy's fix_c1_controls: C1 controls are read as the Windows-1252 bytes they most likely were (U+0085
 * is "…", so fix_line_breaks never sees it). HTML's table for C1 character references is that very
 * mapping, the five bytes Windows-1252 leaves undefined (0x81, 0x8d, ...) kept as they are, like ftfy.
 * (Node 20's TextDecoder('windows-1252') returns nothing for them.)
 */
const C1_CONTROLS = /[\x80-\x9f]/gu;

/** ftfy's fix_latin_ligatures: ligatures of Latin letters spelled out (not the ones languages need, like æ). */
const LIGATURES: Record<string, string> = {
  Ĳ: 'IJ', ĳ: 'ij', ŉ: 'ʼn', Ǳ: 'DZ', ǲ: 'Dz', ǳ: 'dz', Ǆ: 'DŽ', ǅ: 'Dž', ǆ: 'dž', Ǉ: 'LJ', ǈ: 'Lj', ǉ: 'lj', Ǌ: 'NJ', ǋ: 'Nj', ǌ: 'nj',
  ﬀ: 'ff', ﬁ: 'fi', ﬂ: 'fl', ﬃ: 'ffi', ﬄ: 'ffl', ﬅ: 'ſt', ﬆ: 'st',
};
const LIGATURE_PATTERN = new RegExp(`[${Object.keys(LIGATURES).join('')}]`, 'gu');

/**
 * ftfy's fix_character_width: the ideographic space and the half- and full-width forms become their
 * compatibility (NFKC) form, even where that is two characters (U+FFE3 is a space and a macron).
 */
const WIDTH_VARIANTS = /[\u3000\uff01-\uffef]/gu;

/** ftfy's uncurl_quotes: curly, reversed and low-9 quotes and the modifier apostrophe become ASCII. */
const SINGLE_QUOTES = /[\u02bc\u2018-\u201b]/gu;
const DOUBLE_QUOTES = /[\u201c-\u201f]/gu;

/** ftfy's remove_terminal_escapes: ANSI colour and cursor sequences (its `\d` is any decimal digit). */
const TERMINAL_ESCAPES = /\x1b\[[\p{Nd};]*[a-zA-Z]/gu;

/**
 * ftfy's remove_control_chars: C0 controls but tab, line feed, form feed and carriage return (so a
 * vertical tab joins the words around it), DEL, the deprecated Arabic format controls, the interlinear
 * annotation marks, the object replacement character and the byte order mark (also mid-text).
 */
const CONTROL_CHARS = /[\x00-\x08\x0b\x0e-\x1f\x7f\u206a-\u206f\ufeff\ufff9-\ufffc]/gu;

export function fixText(text: string): string {
  // ftfy fixes a line at a time. Its "auto" rule: from the first line with a '<' on, the text may be
  // HTML source, whose entities are meant literally.
  let html = false;
  return text
    .split(/(?<=\n)/u)
    .map((line) => {
      html ||= line.includes('<');
      return fixLine(line, !html);
    })
    .join('');
}

/**
 * Passes at most over a line. ftfy repeats until nothing changes, one level of escaping per pass: a
 * prompt of MAX_PROMPT_LENGTH that is "&amp;amp;amp;..." took 8000 passes, 0.3 s of the server's thread
 * (which counts gpt-image prompts' tokens). No typed prompt is escaped this many times over.
 */
const MAX_PASSES = 16;

/** ftfy repeats its steps until they change nothing: "&amp;amp;" is "&", full-width "＆amp;" too. */
function fixLine(line: string, unescape: boolean): string {
  for (let pass = 0; pass < MAX_PASSES; pass++) {
    const fixed = fixOnce(unescape ? unescapeHtml(line) : line);
    if (fixed === line) return fixed;
    line = fixed;
  }
  return line;
}

function fixOnce(text: string): string {
  // In ftfy's order: the ligature ŉ spells itself with the modifier apostrophe, which uncurl_quotes then makes "'".
  return text
    .replace(C1_CONTROLS, (c) => String.fromCodePoint(replaceCodePoint(c.charCodeAt(0))))
    .replace(LIGATURE_PATTERN, (c) => LIGATURES[c])
    .replace(WIDTH_VARIANTS, (c) => c.normalize('NFKC'))
    .replace(SINGLE_QUOTES, "'")
    .replace(DOUBLE_QUOTES, '"')
    .replace(TERMINAL_ESCAPES, '')
    .replace(CONTROL_CHARS, '')
    .normalize('NFC');
}
