/** Turns prompts into the fixed-length id rows that text encoders take. */
export interface TextTokenizer {
  /** Rows are always exactly this long (77 for CLIP; 256 or 512 for T5). */
  readonly maxLength: number;
  readonly padId: number;
  /** Token ids including special tokens, truncated and padded to `maxLength`. */
  encode(text: string): number[];
}
