/**
 * TensorRT engine files (NVIDIA's TensorRT repositories ship these instead of, or beside, ONNX
 * graphs). An engine is compiled for one GPU model and TensorRT version and only TensorRT can run it;
 * onnxruntime cannot read one, so a folder of them is named for what it is rather than as a folder
 * missing its model.onnx files.
 */

const ENGINE_FILE = /\.(engine|plan|trt)$/i;

export function isTensorRtEngine(file: string): boolean {
  return ENGINE_FILE.test(file);
}

/** What to tell the user about a model that comes as `engines` (paths as they should read them). */
export function tensorRtProblem(engines: readonly string[]): string {
  const shown = [...engines].sort().slice(0, 3).join(', ') + (engines.length > 3 ? ', ...' : '');
  return (
    `it holds TensorRT engines (${shown}) instead of ONNX graphs, and TensorRT engines only run under TensorRT on the GPU they were built for; ` +
    'export ONNX with optimum-cli instead ("optimum-cli export onnx --model <hub id> <folder>"), or install a repository that holds an ONNX export'
  );
}
