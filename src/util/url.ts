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
