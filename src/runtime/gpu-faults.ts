import { componentFile } from './component-file.js';
import { messageOf } from '../util/error-message.js';

/**
 * CUDA errors that end a process's use of the GPU. After one of these, CUDA's documentation says, "the
 * process [is left] in an inconsistent state and any further CUDA work will return the same error": every
 * later run of every model in that worker would fail the same way until it restarts. 700
 * cudaErrorIllegalAddress (an illegal memory access), 702 LaunchTimeout, 714 HardwareStackError, 715
 * IllegalInstruction, 716 MisalignedAddress, 717 InvalidAddressSpace, 718 InvalidPc, 719 LaunchFailure
 * (unspecified launch failure), and 214 ECCUncorrectable. onnxruntime words them "CUDA failure <code>:
 * <cudaGetErrorString> ; GPU=... ; hostname=... ; file=... ; line=... ; expr=..." (cuda_call.cc), inside
 * its "Non-zero status code returned while running <op> node" when a kernel's call met it.
 */
const CONTEXT_LOST = /CUDA failure (700|702|714|715|716|717|718|719|214): ([^;]*)/;

/**
 * A session's run met a CUDA error after which the worker's process cannot use the GPU again (see
 * CONTEXT_LOST): the worker ends after reporting it, and its replacement starts with a new CUDA context.
 * The GPU, its driver or a kernel of onnxruntime's failed, not the request.
 */
export class GpuFaultError extends Error {
  constructor(
    readonly file: string,
    /** CUDA's error as onnxruntime gave it: "CUDA failure 700: an illegal memory access was encountered". */
    readonly detail: string,
    /** As the session was made (its weights copied to the GPU), or as it ran. */
    readonly during: 'load' | 'run',
  ) {
    // The message reaches clients.
    super(`${componentFile(file)}${during === 'load' ? ' (as its weights were copied to the GPU)' : ''}: ${detail}`);
    this.name = 'GpuFaultError';
  }
}

/** Whether `err` is a CUDA error the process cannot go on from (see CONTEXT_LOST). */
export const isGpuFault = (err: unknown): boolean => CONTEXT_LOST.test(messageOf(err));

/** `err` as a GpuFaultError when it is a CUDA error the process cannot go on from, else as it is. */
export function gpuFaultOr(err: unknown, file: string, during: GpuFaultError['during']): unknown {
  const match = CONTEXT_LOST.exec(messageOf(err));
  return match ? new GpuFaultError(file, `CUDA failure ${match[1]}: ${match[2].trim()}`, during) : err;
}
