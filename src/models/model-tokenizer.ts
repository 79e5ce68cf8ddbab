import { loadTokenizer, type LoadTokenizerOptions } from '../tokenizers/load.js';
import type { TextTokenizer } from '../tokenizers/tokenizer.js';
import { firstLineOf } from '../util/error-message.js';
import { ModelLayoutError } from './layout.js';

/**
 * A model folder's tokenizer (`tokenizerDir`, one of its folders). One that cannot be read, damaged or
 * deleted after the scan that found the folder usable, is the folder's problem naming its file, as a
 * graph that cannot be loaded is: the reader's bare error was a 500 that said only "the server had an
 * error". The pipelines' load and the prompt-token count of gpt-image answers both read it here.
 */
export function loadModelTokenizer(modelDir: string, tokenizerDir: string, options?: LoadTokenizerOptions): Promise<TextTokenizer> {
  return loadTokenizer(tokenizerDir, options).catch((err: unknown) => {
    throw new ModelLayoutError(modelDir, `cannot load the tokenizer: ${firstLineOf(err)}`);
  });
}
