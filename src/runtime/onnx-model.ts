import { ort } from './onnxruntime.js';
import { float32ToHalf, halfToFloat32 } from './float16.js';
import { graphSource, rewritesOf } from './graph-rewrite.js';
import { createSession, type ExecutionProvider, type RuntimeOptions, type SessionTuning } from './providers.js';
import { componentFile } from './component-file.js';
import { gpuFaultOr } from './gpu-faults.js';
import { messageOf } from '../util/error-message.js';

/**
 * One ONNX component (text encoder, UNet, transformer, VAE) whose declared input types and ranks drive
 * the feeds: exporters disagree (int32 vs int64 ids, scalar vs [batch] timestep, float16 vs float32),
 * so pipelines hand over plain float32/integer tensors and this class casts them to what the graph says.
 */

export interface HostTensor {
  data: Float32Array | Int32Array;
  dims: readonly number[];
}

/** What a run gives back: every output as float32 (a float16 one widened, any other type refused: see fromOrtTensor). */
export interface FloatTensor extends HostTensor {
  data: Float32Array;
}

/**
 * How onnxruntime says an allocation failed: `std::bad_alloc` from the CPU allocator without an arena,
 * "Failed to allocate memory for requested buffer" from an arena (CPU or CUDA) that could not grow,
 * "Available memory of <n> is smaller than requested bytes of <m>" from one at its limit (both in
 * onnxruntime/core/framework/bfc_arena.cc), CUDA's own "out of memory" (cudaErrorMemoryAllocation, as
 * cuda_call.cc writes it: "CUDA failure 2: out of memory ; GPU=..."), and cuBLAS's and cuDNN's failed
 * workspaces on the GPU ("CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED", cuDNN 9's
 * CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED): test/cuda-provider.test.ts.
 */
const OUT_OF_MEMORY = /std::bad_alloc|Failed to allocate memory|Available memory of \d+ is smaller than requested bytes|out of memory|cudaErrorMemoryAllocation|_ALLOC_FAILED|_ALLOCATION_FAILED/i;

/**
 * onnxruntime could not allocate what a session needed, while creating it (its weights, prepacked
 * kernels: `during` 'load') or running it ('run'). The process is fine; the session or the run is not.
 */
export class OnnxOutOfMemoryError extends Error {
  constructor(
    readonly file: string,
    readonly detail: string,
    readonly during: 'load' | 'run',
  ) {
    super(`${file} ran out of memory (${during}): ${detail}`);
    this.name = 'OnnxOutOfMemoryError';
  }
}

/** `err` as an OnnxOutOfMemoryError when onnxruntime says an allocation failed, else as it is. Exported for the tests. */
export function outOfMemoryOr(err: unknown, file: string, during: OnnxOutOfMemoryError['during']): unknown {
  const message = messageOf(err);
  return OUT_OF_MEMORY.test(message) ? new OnnxOutOfMemoryError(file, message, during) : err;
}

/**
 * A graph whose inputs or outputs are not those its pipeline feeds and reads (an input it does not
 * feed, a rank or a type it cannot feed or read): the model's export is at fault, not the request, and
 * every request for the model meets the same. Named by its component's file, not its path: the message
 * reaches clients. Crosses the worker's process boundary by name (service/failures.ts).
 */
export class GraphMismatchError extends Error {
  constructor(file: string, detail: string) {
    super(`${componentFile(file)} ${detail}`);
    this.name = 'GraphMismatchError';
  }
}

/** Feeds already converted to one graph's input types (see OnnxModel.prepare). */
export interface PreparedFeeds {
  readonly tensors: Readonly<Record<string, ort.Tensor>>;
}

interface InputSpec {
  type: ort.Tensor.Type;
  rank: number;
}

export class OnnxModel {
  private constructor(
    readonly file: string,
    private readonly session: ort.InferenceSession,
    private readonly inputs: Map<string, InputSpec>,
    readonly provider: ExecutionProvider,
  ) {}

  static async load(file: string, runtime: RuntimeOptions, tuning?: SessionTuning): Promise<OnnxModel> {
    const started = performance.now();
    const { session, provider } = await createSession((provider) => graphSource(file, provider, rewritesOf(runtime.graphRewrites)), runtime, tuning).catch((err: unknown) => {
      // Copying the weights to the GPU can meet a fault as a run can (see gpu-faults.ts).
      throw gpuFaultOr(outOfMemoryOr(err, file, 'load'), file, 'load');
    });
    runtime.loaded?.((performance.now() - started) / 1000);
    const inputs = new Map<string, InputSpec>();
    for (const meta of session.inputMetadata) {
      if (!meta.isTensor) {
        await session.release();
        throw new Error(`${file}: input '${meta.name}' is not a tensor; only tensor inputs are supported`);
      }
      inputs.set(meta.name, { type: meta.type, rank: meta.shape.length });
    }
    return new OnnxModel(file, session, inputs, provider);
  }

  hasInput(name: string): boolean {
    return this.inputs.has(name);
  }

  get outputNames(): readonly string[] {
    return this.session.outputNames;
  }

  /**
   * Converts feeds that stay the same for every call of a denoising loop (text conditioning, ids) once
   * instead of on every step: for a float16 graph each conversion is a pass over the whole tensor.
   */
  prepare(feeds: Record<string, HostTensor>): PreparedFeeds {
    return { tensors: this.convert(feeds) };
  }

  /**
   * Runs with the given feeds and those prepared (names the graph lacks are an error, as are inputs
   * neither provides) and returns the wanted outputs as float32.
   */
  async run(feeds: Record<string, HostTensor>, outputs: readonly string[], prepared?: PreparedFeeds): Promise<Record<string, FloatTensor>> {
    const ortFeeds = { ...prepared?.tensors, ...this.convert(feeds) };
    for (const name of this.inputs.keys()) {
      if (!(name in ortFeeds)) throw new GraphMismatchError(this.file, `needs input '${name}', which the pipeline of its model's family does not feed`);
    }
    const result = await this.session.run(ortFeeds, outputs as string[]).catch((err: unknown) => {
      throw gpuFaultOr(outOfMemoryOr(err, this.file, 'run'), this.file, 'run');
    });
    const out: Record<string, FloatTensor> = {};
    for (const name of outputs) out[name] = fromOrtTensor(this.file, name, result[name]);
    return out;
  }

  private convert(feeds: Record<string, HostTensor>): Record<string, ort.Tensor> {
    const converted: Record<string, ort.Tensor> = {};
    for (const [name, tensor] of Object.entries(feeds)) {
      const spec = this.inputs.get(name);
      if (!spec) throw new GraphMismatchError(this.file, `has no input '${name}', which the pipeline of its model's family feeds (it has ${[...this.inputs.keys()].join(', ')})`);
      converted[name] = toOrtTensor(this.file, name, tensor, spec);
    }
    return converted;
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}

/** Fits `dims` to the declared rank: [b] -> scalar for a scalar timestep, extra leading 1s added or dropped. */
function fitRank(file: string, name: string, tensor: HostTensor, rank: number): { data: HostTensor['data']; dims: number[] } {
  let dims = [...tensor.dims];
  let data = tensor.data;
  if (rank === 0 && dims.length === 1) {
    // One timestep shared by the whole batch; a batch with mixed timesteps cannot feed a scalar input.
    if (data.some((v) => v !== data[0])) throw new Error(`${file}: input '${name}' is a scalar but the batch holds different values`);
    data = data.slice(0, 1) as HostTensor['data'];
    dims = [];
  }
  while (dims.length < rank) dims.unshift(1);
  while (dims.length > rank && dims[0] === 1) dims.shift();
  if (rank !== 0 && dims.length !== rank) throw new GraphMismatchError(file, `declares input '${name}' of rank ${rank}, which the pipeline of its model's family feeds with rank ${tensor.dims.length}`);
  return { data, dims };
}

function toOrtTensor(file: string, name: string, tensor: HostTensor, spec: InputSpec): ort.Tensor {
  const { data, dims } = fitRank(file, name, tensor, spec.rank);
  switch (spec.type) {
    case 'float32':
      return new ort.Tensor('float32', data instanceof Float32Array ? data : Float32Array.from(data), dims);
    case 'float16':
      return new ort.Tensor('float16', float32ToHalf(data), dims);
    case 'float64':
      return new ort.Tensor('float64', Float64Array.from(data), dims);
    case 'int32':
      return new ort.Tensor('int32', data instanceof Int32Array ? data : Int32Array.from(data, Math.round), dims);
    case 'int64':
      return new ort.Tensor('int64', BigInt64Array.from(data, (v) => BigInt(Math.round(v))), dims);
    default:
      throw new GraphMismatchError(file, `declares input '${name}' of type ${spec.type}, which cannot be fed from Node (only float32, float16, float64, int32 and int64)`);
  }
}

function fromOrtTensor(file: string, name: string, tensor: ort.Tensor | undefined): FloatTensor {
  if (!tensor) throw new GraphMismatchError(file, `produced no output '${name}'`);
  const dims = tensor.dims as number[];
  switch (tensor.type) {
    case 'float32':
      return { data: tensor.data as Float32Array, dims };
    case 'float16':
      return { data: halfToFloat32(tensor.data as Uint16Array), dims };
    default:
      throw new GraphMismatchError(file, `declares output '${name}' of type ${tensor.type}, which cannot be read here (only float32 and float16)`);
  }
}
