/**
 * Text written by someone else (a model repository's configs, pulled from the Hub) made safe to print in
 * a terminal: its control characters (C0 but newline and tab, DEL, C1) and bidirectional overrides are
 * written as JSON writes them (`\u001b`). Printed as they are, an ESC or a C1 CSI starts an escape
 * sequence that retitles the window, clears the screen, recolours or hides text, or on some terminals
 * writes the clipboard (OSC 52); an override turns the rest of the line around, to read as what it is not.
 */

const UNPRINTABLE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g;

export const printable = (text: string): string => text.replace(UNPRINTABLE, (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`);
