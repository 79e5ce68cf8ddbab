import { quote } from 'shell-quote';

/**
 * A path in a command a message suggests ("install it with: imagegen models import <file>"), as one word
 * a POSIX shell reads back as the same path (shell-quote's quoting: as it is where nothing in it is
 * special to a shell, quoted otherwise). A folder with a space or an apostrophe in its name ("Bob's
 * models") made the suggestion fail, or wait for the quote to close.
 */
export const shellWord = (text: string): string => quote([text]);
