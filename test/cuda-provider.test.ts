import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, inject, it } from 'vitest';
import { GpuFaultError, gpuFaultOr } from '../src/runtime/gpu-faults.js';
import { OnnxOutOfMemoryError, outOfMemoryOr } from '../src/runtime/onnx-model.js';
import { unavailable } from '../src/runtime/providers.js';
import { PROJECT_ROOT } from './helpers/cli.js';
import { cudaInstalled, ortBinFolder } from './helpers/cuda.js';

/**
 * The CUDA path, which no machine here can run (no GPU with CUDA's libraries): what onnxruntime-node 1.30
 * says when the provider cannot start, and when the GPU runs out of memory, as its binary and sources
 * word it, read by the functions that decide between falling back to the CPU, a 507, and a plain failure.
 */

/**
 * onnxruntime's CUDA errors as CudaCall writes them (onnxruntime/core/providers/cuda/cuda_call.cc:
 * "%s failure %d: %s ; GPU=%d ; hostname=%s ; file=%s ; line=%d ; expr=%s; %s", the CUDA runtime's
 * cudaGetErrorString in the middle), behind the location of the ORT_THROW that carries them: the form
 * users of onnxruntime 1.17 and later quote (e.g. "CUDA failure 100: no CUDA-capable device is
 * detected ; GPU=... ; file=.../cuda_execution_provider.cc ; line=245 ; expr=cudaSetDevice(info_.device_id);").
 */
const cudaFailure = (code: number, text: string, expr: string) =>
  new Error(
    '/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_call.cc:129 std::conditional_t<THRW, void, onnxruntime::common::Status> onnxruntime::CudaCall(ERRTYPE, const char*, const char*, ERRTYPE, const char*, const char*, int) [with ERRTYPE = cudaError; bool THRW = true] ' +
      `CUDA failure ${code}: ${text} ; GPU=0 ; hostname=gpu-host ; file=/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_execution_provider.cc ; line=282 ; expr=${expr}; `,
  );

describe.skipIf(cudaInstalled)('onnxruntime-node 1.30 without the CUDA provider libraries (skipped: they are installed here)', () => {
  it('throws "Failed to load shared library" and names the missing library only on stderr, as the fallback warning says', () => {
    // A process of its own, to read onnxruntime's stderr (its logger writes there, not into the error),
    // with onnxruntime-node loaded as the server loads it (src/runtime/onnxruntime.ts, built: telemetry off).
    const model = path.join(inject('referenceModelsDir'), 'sd15-optimum', 'vae_decoder', 'model.onnx');
    const script = `import { ort } from ${JSON.stringify(pathToFileURL(path.join(PROJECT_ROOT, 'dist', 'runtime', 'onnxruntime.js')).href)};
      try { await ort.InferenceSession.create(${JSON.stringify(model)}, { executionProviders: [{ name: 'cuda', deviceId: 0 }] }); console.log('"created"'); }
      catch (err) { console.log(JSON.stringify(err.message)); }`;
    const run = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
    const message = JSON.parse(run.stdout) as string;
    // onnxruntime/core/session/provider_bridge_ort.cc, SessionOptionsAppendExecutionProvider_CUDA_V2: the whole message.
    expect(message).toBe('OrtSessionOptionsAppendExecutionProvider_Cuda: Failed to load shared library');
    // provider_bridge_ort.cc's ProviderLibrary::Get, logged: which library, and dlopen's reason.
    expect(run.stderr).toContain(`Failed to load library ${path.join(ortBinFolder, 'libonnxruntime_providers_shared.so')} with error: `);
    expect(run.stderr).toMatch(/cannot open shared object file: No such file or directory/);
    expect(unavailable('cuda', new Error(message))).toEqual({ reason: message, remedy: expect.stringMatching(/^onnxruntime's own error line \("Failed to load library \.\.\. with error: \.\.\.", in the server's log or on the command's stderr\) names the library/) });
  });
});

describe('which CUDA errors mean the provider cannot start here (the worker then runs on the CPU)', () => {
  it('a provider library that links a CUDA or cuDNN library the host lacks, as onnxruntime logs it', () => {
    // What the error line names when libonnxruntime_providers_cuda.so is there but its dependencies are not.
    const missing = new Error('Failed to load library libonnxruntime_providers_cuda.so with error: libcudnn.so.9: cannot open shared object file: No such file or directory');
    expect(unavailable('cuda', missing)?.remedy).toMatch(/npm run install:cuda/);
  });

  it('no GPU the CUDA runtime can use: none given to the container, a driver older than the runtime', () => {
    const noDevice = cudaFailure(100, 'no CUDA-capable device is detected', 'cudaSetDevice(info_.device_id)');
    expect(unavailable('cuda', noDevice)).toEqual({ reason: expect.stringMatching(/CUDA failure 100: no CUDA-capable device is detected ; GPU=0/), remedy: expect.stringMatching(/^Check that `nvidia-smi` lists the GPU \(in a container, that it was given the GPU/) });
    const oldDriver = cudaFailure(35, 'CUDA driver version is insufficient for CUDA runtime version', 'cudaSetDevice(info_.device_id)');
    expect(unavailable('cuda', oldDriver)?.remedy).toMatch(/driver is as new as the CUDA runtime/);
    expect(unavailable('cuda', cudaFailure(804, 'forward compatibility was attempted on non supported HW', 'cudaSetDevice(info_.device_id)'))).toBeDefined();
  });

  it("a device id beyond the machine's: the remedy names the setting and the worker's device", () => {
    const beyond = cudaFailure(101, 'invalid device ordinal', 'cudaSetDevice(info_.device_id)');
    expect(unavailable('cuda', beyond, 3)?.remedy).toMatch(/^CUDA_DEVICES gives this worker device 3, which the CUDA runtime does not see: `nvidia-smi -L` lists the devices/);
  });

  it('not a GPU out of memory, nor a failure of one model: those stay errors of the model', () => {
    expect(unavailable('cuda', cudaFailure(2, 'out of memory', 'cudaMalloc((void**)&p, size)'))).toBeUndefined();
    expect(unavailable('cuda', new Error('CUDNN failure 4002: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ; GPU=0 ; hostname=gpu-host'))).toBeUndefined();
    expect(unavailable('cuda', new Error("Load model from /models/x/unet/model.onnx failed:Protobuf parsing failed."))).toBeUndefined();
  });
});

describe("the GPU's out-of-memory errors are a 507 (OnnxOutOfMemoryError), like the CPU's", () => {
  const classified = (message: string) => outOfMemoryOr(new Error(message), 'unet/model.onnx', 'run') instanceof OnnxOutOfMemoryError;

  it("recognises CUDA's, the arena's at its limit, cuBLAS's and cuDNN's", () => {
    expect(classified(cudaFailure(2, 'out of memory', 'cudaMalloc((void**)&p, size)').message)).toBe(true);
    // bfc_arena.cc, AllocateRawInternal, at the arena's limit (gpu_mem_limit).
    expect(classified('/onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:359 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Available memory of 34699008 is smaller than requested bytes of 945041920')).toBe(true);
    expect(classified('Non-zero status code returned while running MatMul node. Status Message: CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=0 ; hostname=gpu-host')).toBe(true);
    expect(classified('Non-zero status code returned while running Conv node. Status Message: CUDNN failure 4002: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ; GPU=0')).toBe(true);
  });

  it('leaves the errors that are not about memory as they are', () => {
    expect(classified(cudaFailure(209, 'no kernel image is available for execution on the device', 'cudaGetLastError()').message)).toBe(false);
    expect(classified('CUBLAS failure 13: CUBLAS_STATUS_EXECUTION_FAILED ; GPU=0')).toBe(false);
  });
});

describe('the CUDA errors after which a process cannot use the GPU end the worker (GpuFaultError)', () => {
  const fault = (err: Error, during: 'load' | 'run' = 'run') => gpuFaultOr(err, '/models/sd15/unet/model.onnx', during);

  it("recognises them inside a node's failed run, naming the component and CUDA's words alone", () => {
    const illegal = cudaFailure(700, 'an illegal memory access was encountered', 'cudaStreamSynchronize(static_cast<cudaStream_t>(stream_))');
    const during = new Error(`Non-zero status code returned while running Conv node. Name:'/conv_in/Conv' Status Message: ${illegal.message}`);
    expect(fault(during)).toBeInstanceOf(GpuFaultError);
    expect(fault(during)).toMatchObject({ detail: 'CUDA failure 700: an illegal memory access was encountered', message: 'unet/model.onnx: CUDA failure 700: an illegal memory access was encountered' });
    expect(fault(cudaFailure(719, 'unspecified launch failure', 'cudaStreamSynchronize(stream)'))).toMatchObject({ detail: 'CUDA failure 719: unspecified launch failure' });
    expect(fault(cudaFailure(214, 'uncorrectable ECC error encountered', 'cudaMemcpyAsync(dst, src, bytes)'))).toBeInstanceOf(GpuFaultError);
    // Met as the session was made: said so, not as if the component was running.
    expect(fault(illegal, 'load')).toMatchObject({ message: 'unet/model.onnx (as its weights were copied to the GPU): CUDA failure 700: an illegal memory access was encountered' });
  });

  it('not the errors a process goes on from: out of memory, an invalid argument, a missing kernel, an unknown device', () => {
    for (const [code, text] of [[2, 'out of memory'], [1, 'invalid argument'], [209, 'no kernel image is available for execution on the device'], [101, 'invalid device ordinal']] as const) {
      const err = cudaFailure(code, text, 'cudaGetLastError()');
      expect(fault(err)).toBe(err);
    }
  });
});
