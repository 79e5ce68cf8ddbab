/**
 * A path in a command a message suggests ("install it with: imagegen models import <file>"), as one word
 * a POSIX shell reads back as the same path: left as it is when it holds nothing a shell reads specially
 * (letters of any script, digits, / . _ - + , : @ %), single-quoted otherwise. A folder with a space or
 * an apostrophe in its name ("Bob's models") made the suggestion fail or wait for the quote to close.
 */
export function shellWord(text: string): string {
  if (/^[\p{L}\p{N}/._+,:@%-]+$/u.test(text)) return text;
  // Within single quotes nothing is special but the quote itself: closed, escaped, and opened again.
  return `'${text.replace(/'/g, `'\\''`)}'`;
}
