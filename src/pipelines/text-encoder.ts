import type { HostTensor, OnnxModel } from '../runtime/onnx-model.js';
import type { TextTokenizer } from '../tokenizers/tokenizer.js';

/** A tokenizer and its text encoder, run together on a list of prompts. */
export class TextEncoder {
  constructor(
    readonly model: OnnxModel,
    readonly tokenizer: TextTokenizer,
  ) {}

  /**
   * One row per prompt. Each distinct prompt is encoded once: a request for n images of one prompt, or
   * a merged batch sharing the empty negative prompt, runs the encoder on one row, not n.
   */
  async encode(prompts: readonly string[], outputs: readonly string[]): Promise<Record<string, HostTensor>> {
    const distinct = [...new Set(prompts)];
    const length = this.tokenizer.maxLength;
    const ids = new Int32Array(distinct.length * length);
    distinct.forEach((prompt, b) => ids.set(this.tokenizer.encode(prompt), b * length));
    const encoded = await this.model.run({ input_ids: { data: ids, dims: [distinct.length, length] } }, outputs);
    if (distinct.length === prompts.length) return encoded;
    const rowOf = prompts.map((prompt) => distinct.indexOf(prompt));
    return Object.fromEntries(Object.entries(encoded).map(([name, tensor]) => [name, gatherRows(tensor, rowOf)]));
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
function gatherRows(tensor: HostTensor, rows: readonly number[]): HostTensor {
  const per = tensor.data.length / tensor.dims[0];
  const data = new Float32Array(rows.length * per);
  rows.forEach((row, b) => data.set(tensor.data.subarray(row * per, (row + 1) * per), b * per));
  return { data, dims: [rows.length, ...tensor.dims.slice(1)] };
}
