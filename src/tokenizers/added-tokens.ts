/**
 * transformers cuts a prompt at its added tokens (special tokens and the like, e.g. SD 2's pad "!")
 * before any cleaning or BPE, so that a token typed in the prompt becomes its own id.
 */

/** A piece of text to tokenize, or the id of an added token found in the prompt. */
export type Segment = string | number;

export class AddedTokenSplitter {
  private readonly pattern: RegExp | undefined;

  /** @param tokens content -> id */
  constructor(private readonly tokens: ReadonlyMap<string, number>) {
    // Longest first, so that at any position the longest token wins, as with transformers' trie.
    const alternatives = [...tokens.keys()]
      .filter((token) => token !== '')
      .sort((a, b) => b.length - a.length)
      .map((token) => token.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
    this.pattern = alternatives.length ? new RegExp(`(${alternatives.join('|')})`, 'u') : undefined;
  }

  split(text: string): Segment[] {
    if (!this.pattern) return [text];
    // With one capturing group, split() alternates text and matched tokens.
    return text
      .split(this.pattern)
      .map((part, index) => (index % 2 === 1 ? (this.tokens.get(part) as number) : part))
      .filter((segment) => segment !== '');
  }
}
