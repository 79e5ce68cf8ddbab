import { decodeHTML, decodeHTMLStrict } from 'entities';

/**
 * ftfy's unescape_html: HTML character references in text that is not HTML itself. Only references
 * that end in ';' and are at most 24 letters or digits long are read (a longer one, like
 * &CounterClockwiseContourIntegral;, stays as typed), and a numeric one only when all of it is a number.
 */
const REFERENCE = /&#?[0-9A-Za-z]{1,24};/g;
const NUMERIC = /^&#(?:([0-9]+)|[xX]([0-9a-fA-F]+));$/;

export function unescapeHtml(text: string): string {
  return text.replace(REFERENCE, (reference) => (reference.startsWith('&#') ? numeric(reference) : named(reference)));
}

function named(reference: string): string {
  const exact = decodeHTMLStrict(reference);
  if (exact !== reference) return exact;
  // ftfy also reads an all-lower-case name typed in capitals (P&EACUTE;REZ is PÉREZ), unless HTML
  // reads those capitals another way (&GTRSIM; starts with the legacy &GT).
  if (reference !== reference.toUpperCase() || decodeHTML(reference) !== reference) return reference;
  const lower = reference.toLowerCase();
  const char = decodeHTMLStrict(lower);
  return char === lower ? reference : char.toUpperCase();
}

function numeric(reference: string): string {
  const digits = NUMERIC.exec(reference);
  if (!digits) return reference;
  const code = digits[1] !== undefined ? Number(digits[1]) : parseInt(digits[2], 16);
  // Python's html.unescape, which ftfy calls, makes the code points HTML forbids in references
  // (controls, noncharacters) nothing at all, after mapping C1 codes as Windows-1252 ones.
  if (isDroppedCodePoint(code)) return '';
  const char = decodeHTMLStrict(reference);
  // ftfy takes a ';' in the result for a reference read only in part, and keeps the reference: &#59; stays.
  return char.includes(';') ? reference : char;
}

function isDroppedCodePoint(code: number): boolean {
  return (
    (code >= 0x1 && code <= 0x8) ||
    code === 0xb ||
    (code >= 0xe && code <= 0x1f) ||
    code === 0x7f ||
    (code >= 0xfdd0 && code <= 0xfdef) ||
    (code <= 0x10ffff && (code & 0xfffe) === 0xfffe)
  );
}
