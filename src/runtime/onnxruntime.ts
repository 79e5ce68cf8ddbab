/**
 * onnxruntime-node, for every module that runs it. Imported from here, never directly, so that its
 * telemetry is off before it loads (telemetry-off.ts); an ES module's imports run in the order they
 * are written, so the opt-out is set before the library's first line.
 */
import './telemetry-off.js';
import { Tensor } from 'onnxruntime-node';

export * as ort from 'onnxruntime-node';

/**
 * float16 tensors travel as Uint16Array bits (float16.ts), on every Node. Where the Float16Array
 * global exists (Node 24 and later), onnxruntime-common 1.30 makes a float16 tensor's data a
 * Float16Array view, whose size onnxruntime-node's binding reads as 0 bytes: every fp16 model failed
 * its first run with "not enough space: expected N, got 0" (microsoft/onnxruntime PR #32323, not
 * released), and a float16 output came back as numbers rather than bits. The library looks for the
 * global once, at its first tensor, so that tensor is made here with the global hidden for a moment.
 */
const float16Array = Object.getOwnPropertyDescriptor(globalThis, 'Float16Array');
if (float16Array) {
  Reflect.deleteProperty(globalThis, 'Float16Array');
  try {
    new Tensor('float32', new Float32Array(0), [0]);
  } finally {
    Object.defineProperty(globalThis, 'Float16Array', float16Array);
  }
}
