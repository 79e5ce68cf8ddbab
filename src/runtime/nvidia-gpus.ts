import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { messageOf } from '../util/error-message.js';

/**
 * The NVIDIA GPUs' memory, from `nvidia-smi`, which comes with every NVIDIA driver: onnxruntime-node
 * gives JavaScript no way to ask CUDA (and NVML would take a native addon). Kept to the figure the
 * loaded models' budget needs (MODEL_MEMORY_BUDGET's default on CUDA, server.ts).
 */

export interface NvidiaGpus {
  /** How many GPUs nvidia-smi lists: those of the machine, or those given to its container. */
  count: number;
  /** The memory of the smallest of them, in bytes. */
  smallestBytes: number;
}

/**
 * The GPUs in `nvidia-smi --query-gpu=index,memory.total --format=csv,noheader,nounits` output, one
 * "index, MiB" line each; undefined when it lists none or a line is not that.
 */
export function parseGpuMemory(text: string): NvidiaGpus | undefined {
  const lines = text.split('\n').map((line) => line.trim()).filter((line) => line !== '');
  const mib = lines.map((line) => /^\d+,\s*(\d+)$/.exec(line)?.[1]);
  if (mib.length === 0 || mib.some((m) => m === undefined)) return undefined;
  return { count: mib.length, smallestBytes: Math.min(...mib.map(Number)) * 1024 ** 2 };
}

/** The GPUs nvidia-smi lists, or why it could not say (not installed, no driver loaded, output not understood). */
export async function nvidiaGpus(command = 'nvidia-smi'): Promise<NvidiaGpus | { problem: string }> {
  try {
    const { stdout } = await promisify(execFile)(command, ['--query-gpu=index,memory.total', '--format=csv,noheader,nounits'], { timeout: 10_000 });
    return parseGpuMemory(stdout) ?? { problem: `nvidia-smi listed no GPU memory it could be read from (${JSON.stringify(stdout.trim().slice(0, 200))})` };
  } catch (err) {
    // Failing, it says why on its output (no driver loaded, say), where the error's message only repeats the command.
    const { stdout = '', stderr = '' } = err as { stdout?: string; stderr?: string };
    const said = `${stderr}\n${stdout}`.trim().split('\n')[0];
    return { problem: `nvidia-smi could not be run (${said || messageOf(err).split('\n')[0]})` };
  }
}
