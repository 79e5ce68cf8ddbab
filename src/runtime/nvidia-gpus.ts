import { execFile } from 'node:child_process';
import { firstLineOf } from '../util/error-message.js';

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

/** How long nvidia-smi may take to answer: it does within a few seconds (slower without persistence mode), unless its driver lost a GPU (it then hangs). */
const ANSWER_MS = 10_000;

/** The GPUs nvidia-smi lists, or why it could not say (not installed, no driver loaded, no answer, output not understood). */
export async function nvidiaGpus(command = 'nvidia-smi', answerMs = ANSWER_MS): Promise<NvidiaGpus | { problem: string }> {
  const answer = await query(command, answerMs);
  if ('problem' in answer) return answer;
  return parseGpuMemory(answer.stdout) ?? { problem: `nvidia-smi listed no GPU memory it could be read from (${JSON.stringify(answer.stdout.trim().slice(0, 200))})` };
}

/**
 * nvidia-smi's output, or why there is none, within `answerMs` by a timer of its own: execFile's
 * `timeout` kills the process but answers only once its output closes, which one that a driver holds
 * (a GPU fallen off the bus: even SIGKILL waits on the driver) or a wrapper script's child never does,
 * and the server's start waited with it.
 */
function query(command: string, answerMs: number): Promise<{ stdout: string } | { problem: string }> {
  return new Promise((resolve) => {
    const child = execFile(command, ['--query-gpu=index,memory.total', '--format=csv,noheader,nounits'], (err, stdout, stderr) => {
      clearTimeout(timer);
      if (!err) return resolve({ stdout });
      // Failing, it says why on its output (no driver loaded, say), where the error's message only repeats the command.
      const said = `${stderr}\n${stdout}`.trim().split('\n')[0];
      resolve({ problem: `nvidia-smi could not be run (${said || firstLineOf(err)})` });
    });
    const timer = setTimeout(() => {
      // Left to end when it can, holding nothing of the server's.
      child.kill('SIGKILL');
      child.stdout?.destroy();
      child.stderr?.destroy();
      child.unref();
      resolve({ problem: `nvidia-smi did not answer within ${answerMs / 1000} s (its driver may have lost a GPU: the kernel log's NVIDIA Xid errors say)` });
    }, answerMs);
  });
}
