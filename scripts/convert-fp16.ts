/**
 * Writes a float16 copy of a model folder (as `optimum-cli export onnx --fp16` would have made it):
 *
 *   npm run convert:fp16 -- <source-folder> <target-folder> [--keep-float32 <OpType> ...]
 *
 * Every model.onnx becomes float16 (weights, inputs, outputs, computation); integer inputs stay as they
 * are. Weights kept beside a graph (model.onnx_data) go to a float16 model.onnx_data of its own. `--keep-float32` keeps the named ops computing in float32 between Casts, for providers that
 * compute in float16 (onnxruntime's CPU provider needs none: see scripts/fp16/convert.ts).
 */
import { parseArgs } from 'node:util';
import { convertFolderToFloat16 } from './fp16/convert-folder.js';
import { messageOf } from '../src/util/error-message.js';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    'keep-float32': { type: 'string', multiple: true, default: [] },
    help: { type: 'boolean', short: 'h', default: false },
  },
});

if (values.help || positionals.length !== 2) {
  console.log('usage: convert-fp16 <source-folder> <target-folder> [--keep-float32 <OpType> ...]');
  process.exit(values.help ? 0 : 2);
}

const [source, target] = positionals;
try {
  const converted = await convertFolderToFloat16(source, target, { blockList: new Set(values['keep-float32']) });
  for (const { file, milliseconds } of converted) console.log(`${file}: float16 in ${milliseconds.toFixed(0)} ms`);
} catch (err) {
  // What went wrong in a line (a folder that is not there, a graph that is not ONNX), not Node's stack trace.
  console.error(`convert-fp16: ${messageOf(err)}`);
  process.exit(1);
}
