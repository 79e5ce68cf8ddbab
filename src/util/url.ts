/**
 * `text` parsed as a URL, or undefined where it is none: parsed once, where URL.canParse followed by
 * new URL parses twice (Node 20 has no URL.parse, which does this).
 */
export function parseUrl(text: string): URL | undefined {
  try {
    return new URL(text);
  } catch {
    return undefined;
  }
}

/**
 * `text` with what a URL holds between its scheme and its last '@' (its user and password) shown as
 * '[redacted]', for errors and the log. Read as text, not parsed: it serves values a URL parser refuses,
 * and a password may hold a '/' that would end a parsed URL's authority early.
 */
export function withoutCredentials(text: string): string {
  return text.replace(/^([a-z][a-z\d+.-]*:\/\/).*@/is, '$1[redacted]@');
}
