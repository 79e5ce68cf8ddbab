import os from 'node:os';
import { ort } from './onnxruntime.js';
import type { GraphSource } from './graph-rewrite.js';
import { firstLineOf } from '../util/error-message.js';
import { isGpuFault } from './gpu-faults.js';

/**
 * Where a worker's models run. `cuda`: NVIDIA GPUs, with the CUDA provider libraries that
 * `npm run install:cuda` fetches and the CUDA runtime on the host. `webgpu`: any GPU with a Vulkan
 * driver (Linux), Direct3D 12 (Windows) or Metal (macOS), through the WebGPU provider built into
 * onnxruntime-node, so nothing beyond the GPU's driver has to be installed.
 */
export const EXECUTION_PROVIDERS = ['cpu', 'cuda', 'webgpu'] as const;
export type ExecutionProvider = (typeof EXECUTION_PROVIDERS)[number];

export const isExecutionProvider = (name: string): name is ExecutionProvider => (EXECUTION_PROVIDERS as readonly string[]).includes(name);

/** Which of graph-rewrite.ts's rewrites a worker's graphs get: all, or only those that are exact. */
export const GRAPH_REWRITE_SETS = ['all', 'exact'] as const;
export type GraphRewrites = (typeof GRAPH_REWRITE_SETS)[number];

/** How this worker runs ONNX sessions. */
export interface RuntimeOptions {
  provider: ExecutionProvider;
  /** CUDA device for this worker. */
  deviceId?: number;
  /** Intra-op threads per session: by default each worker's share of the cores (see EnginePoolOptions.threadsPerWorker). */
  threads?: number;
  /**
   * Whether idle intra-op (and inter-op) threads spin-wait for their next task instead of sleeping:
   * onnxruntime's default, but on a machine whose cores are all taken (several workers, the server
   * encoding images) the spinning steals the cores the work needs. Default false.
   */
  spinning?: boolean;
  /**
   * Which of graph-rewrite.ts's rewrites the graphs get as they load: 'all' (default), or 'exact', only
   * those that keep the exported graph's values bit for bit.
   */
  graphRewrites?: GraphRewrites;
  /** Where to say that the GPU provider could not be used. */
  warn?: (message: string) => void;
  /** Hears the seconds each session took to load (OnnxModel.load): a worker times its batches without them. */
  loaded?: (seconds: number) => void;
}

export const defaultRuntime = (): RuntimeOptions => ({ provider: 'cpu', threads: Math.max(1, os.availableParallelism()) });

/**
 * The GPU providers that failed to start, per runtime (its options object): later sessions go straight
 * to the CPU instead of failing, and warning, again. Kept by runtime rather than for the process, so
 * that two runtimes in one process (tests) do not share it.
 */
const brokenProviders = new WeakMap<RuntimeOptions, Set<ExecutionProvider>>();

/** The provider `runtime`'s sessions are made on: its own, or the CPU once that failed to start (see createSession). */
export const providerInUse = (runtime: RuntimeOptions): ExecutionProvider => (brokenProviders.get(runtime)?.has(runtime.provider) ? 'cpu' : runtime.provider);

/** One way a GPU provider fails to start on a machine, and what to do about it. */
interface Unavailable {
  pattern: RegExp;
  /** What to do; `deviceId`, the CUDA device the worker was given. */
  remedy: string | ((deviceId: number) => string);
}

/**
 * Errors that say a GPU provider cannot start on this machine at all, rather than that one model
 * cannot run on it (a model too large for the card, a corrupt file): CUDA's libraries not loading, no
 * GPU that CUDA can use, or no WebGPU adapter (no GPU, or no Vulkan driver for it). The first cause
 * whose pattern matches onnxruntime's message names the remedy.
 */
const UNAVAILABLE: Record<Exclude<ExecutionProvider, 'cpu'>, { name: string; causes: readonly Unavailable[] }> = {
  cuda: {
    name: 'CUDA',
    causes: [
      // CUDA's own errors from the provider's first calls as a session is made (cudaSetDevice), in
      // onnxruntime's words: "CUDA failure <code>: <cudaGetErrorString> ; GPU=... ; hostname=... ; ...
      // expr=cudaSetDevice(info_.device_id);" (onnxruntime/core/providers/cuda/cuda_call.cc, CudaCall's
      // snprintf). 101, cudaErrorInvalidDevice: "invalid device ordinal", a device id beyond the machine's.
      {
        pattern: /CUDA failure 101: /,
        remedy: (deviceId) =>
          `CUDA_DEVICES gives this worker device ${deviceId}, which the CUDA runtime does not see: \`nvidia-smi -L\` lists the devices, numbered from 0 (within CUDA_VISIBLE_DEVICES where that is set).`,
      },
      // No GPU the runtime can use: 100 cudaErrorNoDevice "no CUDA-capable device is detected" (a
      // container not given the GPU), 35 cudaErrorInsufficientDriver and 804 cudaErrorCompatNotSupportedOnDevice
      // (a driver older than the CUDA runtime the provider links), 803 cudaErrorSystemDriverMismatch,
      // 34 cudaErrorStubLibrary (libcuda.so is the toolkit's stub), 46 cudaErrorDevicesUnavailable (held
      // by another process in exclusive-process mode).
      {
        pattern: /CUDA failure (34|35|46|100|803|804): /,
        remedy:
          "Check that `nvidia-smi` lists the GPU (in a container, that it was given the GPU: docker run --gpus, Kubernetes' nvidia.com/gpu), that its driver is as new as the CUDA runtime onnxruntime's provider links needs (README), and that no other process holds it in exclusive mode; or set EXECUTION_PROVIDER=webgpu or cpu.",
      },
      // The provider's libraries, or the CUDA and cuDNN ones they link, not loading. onnxruntime-node 1.30
      // throws only "OrtSessionOptionsAppendExecutionProvider_Cuda: Failed to load shared library"
      // (onnxruntime/core/session/provider_bridge_ort.cc, SessionOptionsAppendExecutionProvider_CUDA_V2);
      // the library and dlopen's reason are in its own error line on stderr (test/cuda-provider.test.ts),
      // which a worker's server logs (native-output.ts).
      // Not any message naming cuDNN: its CUDNN_STATUS_..._ALLOCATION_FAILED is the GPU's memory.
      {
        pattern: /failed to load (shared )?library|providers_cuda|providers_shared|libcu/i,
        remedy:
          "onnxruntime's own error line (\"Failed to load library ... with error: ...\", in the server's log or on the command's stderr) names the library that did not load and why. Install the CUDA provider libraries (npm run install:cuda) and the CUDA runtime, cuBLAS and cuDNN they link, as the README's GPU (CUDA) section says; or set EXECUTION_PROVIDER=webgpu or cpu.",
      },
      // onnxruntime-node built without CUDA (every build but Linux x64's: Windows, macOS, Linux arm64),
      // where its backend is not registered: 'backend not found', which failed every model instead.
      { pattern: /\[cuda\] backend not found/i, remedy: 'onnxruntime-node has the CUDA provider on Linux x64 only: set EXECUTION_PROVIDER=webgpu or cpu.' },
    ],
  },
  webgpu: {
    name: 'WebGPU',
    causes: [
      {
        // No adapter; or onnxruntime-node built without WebGPU (its Linux arm64 build): 'backend not found'.
        pattern: /WebGPU adapter|No supported adapters|webgpu\] backend not found/i,
        // Dawn runs over Vulkan on Linux, Direct3D 12 on Windows and Metal on macOS (whose drivers come with the system).
        remedy: "Install the GPU's driver (on Linux its Vulkan driver and the libvulkan1 loader; on Windows one with Direct3D 12), or set EXECUTION_PROVIDER=cpu.",
      },
    ],
  },
};

/**
 * Where `err` says `provider` cannot start here (UNAVAILABLE): onnxruntime's reason and what to do,
 * else undefined. `deviceId`: the worker's CUDA device. Exported for the tests.
 */
export function unavailable(provider: ExecutionProvider, err: unknown, deviceId = 0): { reason: string; remedy: string } | undefined {
  if (provider === 'cpu') return undefined;
  // onnxruntime's first line, less the source location and failed check it starts with.
  const reason = firstLineOf(err).split(' was false. ').at(-1)!;
  const cause = UNAVAILABLE[provider].causes.find(({ pattern }) => pattern.test(reason));
  if (!cause) return undefined;
  return { reason, remedy: typeof cause.remedy === 'string' ? cause.remedy : cause.remedy(deviceId) };
}

/** What one component's session needs beyond the worker's runtime. */
export interface SessionTuning {
  /**
   * Keep onnxruntime's CPU memory arena (default true). The arena keeps a session's peak activations
   * allocated after a run, which saves allocations for a graph run many times per image (the denoiser)
   * but pins gigabytes for one run once per image at full resolution: a VAE decoder at 1024x1024
   * held 6.5 GiB after a decode with the arena and 0.6 GiB without it (measured on the SDXL export).
   */
  memoryArena?: boolean;
}

function providerOption(runtime: RuntimeOptions, provider: ExecutionProvider): ort.InferenceSession.ExecutionProviderConfig {
  if (provider === 'cuda') return { name: 'cuda', deviceId: runtime.deviceId ?? 0 };
  return provider;
}

/** `weightsFolder`: where a graph made from memory finds its external weights. */
function sessionOptions(runtime: RuntimeOptions, provider: ExecutionProvider, tuning: SessionTuning, weightsFolder?: string): ort.InferenceSession.SessionOptions {
  const spin = runtime.spinning ? '1' : '0';
  return {
    // Operators the GPU provider lacks run on the CPU provider, which onnxruntime always adds last.
    executionProviders: [providerOption(runtime, provider)],
    graphOptimizationLevel: 'all',
    enableCpuMemArena: tuning.memoryArena ?? true,
    // One request at a time per worker: parallelism comes from intra-op threads and from more workers.
    executionMode: 'sequential',
    intraOpNumThreads: runtime.threads,
    interOpNumThreads: 1,
    // Session config entries; onnxruntime-node joins the nested keys into "session.intra_op.allow_spinning".
    extra: {
      session: {
        intra_op: { allow_spinning: spin },
        inter_op: { allow_spinning: spin },
        ...(weightsFolder && { model_external_initializers_file_folder_path: weightsFolder }),
      },
    },
  };
}

/** The graph to make a session from on a given provider (graph-rewrite.ts's rewrites differ by provider). */
export type GraphFor = (provider: ExecutionProvider) => Promise<GraphSource>;

/**
 * Creates a session on the configured provider, of `graph` or of what `graph` gives for the provider
 * the session is made on. onnxruntime-node throws (rather than falling back) when a GPU provider cannot
 * start (CUDA's libraries missing, no WebGPU adapter), so that failure is caught, reported once, and
 * the session is made on CPU.
 */
export async function createSession(graph: GraphSource | GraphFor, runtime: RuntimeOptions, tuning: SessionTuning = {}): Promise<{ session: ort.InferenceSession; provider: ExecutionProvider }> {
  const create = async (provider: ExecutionProvider) => {
    const source = typeof graph === 'function' ? await graph(provider) : graph;
    if (typeof source === 'string') return ort.InferenceSession.create(source, sessionOptions(runtime, provider, tuning));
    try {
      return await ort.InferenceSession.create(source.bytes, sessionOptions(runtime, provider, tuning, source.folder));
    } catch (err) {
      // A rewrite's checks cover the graphs exporters write (graph-rewrite.ts); should one still make a
      // graph onnxruntime refuses, the model loads as exported (and what fails for the file is reported).
      // Not after a GPU fault, which every later call of this process meets too: it is no graph's doing.
      if (source.file === undefined || unavailable(provider, err, runtime.deviceId) || isGpuFault(err)) throw err;
      (runtime.warn ?? console.warn)(`${source.file}: its rewritten graph did not load (${firstLineOf(err)}); loading it as exported.`);
      return ort.InferenceSession.create(source.file, sessionOptions(runtime, provider, tuning));
    }
  };
  const { provider } = runtime;
  const broken = brokenProviders.get(runtime) ?? new Set<ExecutionProvider>();
  if (provider !== 'cpu' && !broken.has(provider)) {
    try {
      return { session: await create(provider), provider };
    } catch (err) {
      const cause = unavailable(provider, err, runtime.deviceId);
      if (cause === undefined) throw err;
      brokenProviders.set(runtime, broken.add(provider));
      (runtime.warn ?? console.warn)(`${UNAVAILABLE[provider].name} execution provider unavailable (${cause.reason}); running on CPU. ${cause.remedy}`);
    }
  }
  return { session: await create('cpu'), provider: 'cpu' };
}
