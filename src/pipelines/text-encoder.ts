import type { FloatTensor, OnnxModel } from '../runtime/onnx-model.js';
import type { TextTokenizer } from '../tokenizers/tokenizer.js';
import { concatRows } from './tensor.js';

/** A tokenizer and its text encoder, run together on a list of prompts. */
export class TextEncoder {
  /**
   * The empty prompt's row of each output asked for so far: every guided batch without a negative
   * prompt needs it, and it never changes, so it is encoded once per loaded model.
   */
  private readonly emptyRows = new Map<string, FloatTensor>();

  constructor(
    readonly model: OnnxModel,
    readonly tokenizer: TextTokenizer,
  ) {}

  /**
   * One row per prompt. Each distinct prompt is encoded once: a request for n images of one prompt, or
   * a merged batch sharing the empty negative prompt, runs the encoder on one row, not n; and the empty
   * prompt once per model (emptyRows).
   */
  async encode(prompts: readonly string[], outputs: readonly string[]): Promise<Record<string, FloatTensor>> {
    const distinct = [...new Set(prompts)];
    const emptyKnown = distinct.includes('') && outputs.every((name) => this.emptyRows.has(name));
    const toRun = emptyKnown ? distinct.filter((prompt) => prompt !== '') : distinct;
    const encoded = toRun.length ? await this.run(toRun, outputs) : {};
    if (toRun.includes('')) for (const name of outputs) this.emptyRows.set(name, gatherRows(encoded[name], [toRun.indexOf('')]));
    // The rows at hand: those run, then the empty prompt's when it was known.
    const table = emptyKnown ? Object.fromEntries(outputs.map((name) => [name, withEmptyRow(encoded[name], this.emptyRows.get(name)!)])) : encoded;
    const order = emptyKnown ? [...toRun, ''] : toRun;
    if (order.length === prompts.length && order.every((prompt, i) => prompt === prompts[i])) return table;
    const rowOf = prompts.map((prompt) => order.indexOf(prompt));
    return Object.fromEntries(Object.entries(table).map(([name, tensor]) => [name, gatherRows(tensor, rowOf)]));
  }

  private run(prompts: readonly string[], outputs: readonly string[]): Promise<Record<string, FloatTensor>> {
    const length = this.tokenizer.maxLength;
    const ids = new Int32Array(prompts.length * length);
    prompts.forEach((prompt, b) => ids.set(this.tokenizer.encode(prompt), b * length));
    return this.model.run({ input_ids: { data: ids, dims: [prompts.length, length] } }, outputs);
  }

  /**
   * SDXL conditions on the penultimate layer (`hidden_states[-2]`); exports list the layers as
   * `hidden_states.0..N`. Without them the last hidden state is the best there is.
   */
  penultimateHiddenState(): string {
    const layers = this.model.outputNames
      .map((name) => /^hidden_states\.(\d+)$/.exec(name))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => Number(m[1]));
    if (layers.length < 2) return 'last_hidden_state';
    return `hidden_states.${Math.max(...layers) - 1}`;
  }
}

/** Rows `rows` of a [batch, ...] tensor, in that order. */
function gatherRows(tensor: FloatTensor, rows: readonly number[]): FloatTensor {
  const per = tensor.data.length / tensor.dims[0];
  const data = new Float32Array(rows.length * per);
  rows.forEach((row, b) => data.set(tensor.data.subarray(row * per, (row + 1) * per), b * per));
  return { data, dims: [rows.length, ...tensor.dims.slice(1)] };
}

/** The rows run, then the empty prompt's (only it when nothing else ran). */
function withEmptyRow(encoded: FloatTensor | undefined, empty: FloatTensor): FloatTensor {
  return encoded ? concatRows(encoded, empty) : empty;
}
