import { execFile } from 'node:child_process';
import { firstLineOf } from '../util/error-message.js';

/**
 * The NVIDIA GPUs' memory, from `nvidia-smi`, which comes with every NVIDIA driver: onnxruntime-node
 * gives JavaScript no way to ask CUDA (and NVML would take a native addon). Kept to the figure the
 * loaded models' budget needs (MODEL_MEMORY_BUDGET's default on CUDA, server.ts): the memory of the
 * GPUs the workers run on, where that can be told.
 */

/** One GPU as nvidia-smi lists it, in its order (the PCI bus's). */
export interface NvidiaGpu {
  /** nvidia-smi's number for it. */
  index: number;
  /** "GPU-8e5c…", as CUDA_VISIBLE_DEVICES may name it. */
  uuid: string;
  memoryBytes: number;
  /** Whether it is split into MIG instances, whose memory nvidia-smi's memory.total does not give (it gives the whole GPU's). */
  mig: boolean;
}

/**
 * The GPUs in `nvidia-smi --query-gpu=index,uuid,memory.total,mig.mode.current --format=csv,noheader,nounits`
 * output, one "index, uuid, MiB, MIG mode" line each (the mode "Enabled", "Disabled", or "[N/A]" on a
 * GPU without MIG); undefined when it lists none or a line is not that. Its "WARNING: …" lines (an
 * infoROM it found corrupted, on a GPU that still works) are no GPU's, and are passed over.
 */
export function parseGpus(text: string): NvidiaGpu[] | undefined {
  const lines = text
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '' && !line.startsWith('WARNING:'));
  const gpus: NvidiaGpu[] = [];
  for (const line of lines) {
    const fields = /^(\d+),\s*(GPU-[\w-]+),\s*(\d+),\s*(.*)$/.exec(line);
    if (!fields) return undefined;
    gpus.push({ index: Number(fields[1]), uuid: fields[2], memoryBytes: Number(fields[3]) * 1024 ** 2, mig: fields[4] === 'Enabled' });
  }
  return gpus.length > 0 ? gpus : undefined;
}

/** What the CUDA runtime reads of the environment to number its devices (the workers inherit it). */
export interface CudaEnvironment {
  CUDA_VISIBLE_DEVICES?: string;
  CUDA_DEVICE_ORDER?: string;
}

/**
 * The GPUs a budget is to be taken from, and how they were told; or the MIG instance CUDA_VISIBLE_DEVICES
 * gives a worker ("MIG-…"), whose memory nvidia-smi's listing does not give (only its GPU's, whole).
 */
export type GpusInUse =
  | {
      /** The GPUs, smallest first. */
      gpus: NvidiaGpu[];
      /** Whether they are the ones the workers run on (false: every GPU the workers could be on, CUDA's numbering being unknown). */
      exact: boolean;
    }
  | { migInstance: string };

/**
 * The GPUs that CUDA devices `devices` (CUDA_DEVICES) are, as far as nvidia-smi can tell. CUDA numbers
 * the devices it sees fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID (nvidia-smi's order), and only
 * those CUDA_VISIBLE_DEVICES lists, in its order, where it is set: by number (in CUDA's order of all
 * the devices) or by UUID (or its prefix), up to the first entry it cannot use. Where a device cannot be
 * told so (fastest first, which nvidia-smi cannot say), every GPU it could be counts, and the budget is
 * the smallest's. A MIG instance named in CUDA_VISIBLE_DEVICES is said as such: nvidia-smi lists the
 * whole GPU's memory, not the instance's. undefined when `devices` name none of the devices CUDA sees
 * (the workers will not get CUDA then).
 */
export function gpusInUse(gpus: readonly NvidiaGpu[], devices: readonly number[], env: CudaEnvironment): GpusInUse | undefined {
  const pciOrder = env.CUDA_DEVICE_ORDER === 'PCI_BUS_ID';
  // Each device CUDA sees, in its numbering: a GPU, null where which GPU it is cannot be told, or the name
  // of a MIG instance (CUDA runs on one named so: the MIG user guide's way to give a process one).
  const visible: (NvidiaGpu | null | string)[] = [];
  for (const entry of env.CUDA_VISIBLE_DEVICES?.split(',') ?? gpus.map((gpu) => String(gpu.index))) {
    const name = entry.trim();
    if (name.startsWith('MIG-')) {
      visible.push(name);
      continue;
    }
    const byNumber = /^\d+$/.test(name) ? Number(name) : undefined;
    const gpu = byNumber !== undefined ? gpus.find((g) => g.index === byNumber) : name.startsWith('GPU-') ? gpus.find((g) => g.uuid.startsWith(name)) : undefined;
    // CUDA stops at an entry it cannot use: a number beyond its devices, an unknown UUID.
    if (!gpu) break;
    visible.push(byNumber === undefined || pciOrder || gpus.length === 1 ? gpu : null);
  }
  const used = devices.filter((device) => device < visible.length).map((device) => visible[device]);
  if (used.length === 0) return undefined;
  const migInstance = used.find((device): device is string => typeof device === 'string');
  if (migInstance !== undefined) return { migInstance };
  const known = used.filter((gpu): gpu is NvidiaGpu => gpu !== null && typeof gpu !== 'string');
  const exact = known.length === used.length;
  // Not exact: a device CUDA numbered fastest first could be any of the machine's GPUs.
  return { gpus: [...new Set(exact ? known : gpus)].sort((a, b) => a.memoryBytes - b.memoryBytes), exact };
}

/**
 * nvidia-smi's exit status for an infoROM it found corrupted: a warning (the GPU works, CUDA runs on
 * it), given with the full listing, whose GPUs' memory is then read as any other's. Other failures'
 * listings may lack a GPU, and are not read.
 */
const INFOROM_CORRUPTED = 14;

/** How long nvidia-smi may take to answer: it does within a few seconds (slower without persistence mode), unless its driver lost a GPU (it then hangs). */
const ANSWER_MS = 10_000;

/** The GPUs nvidia-smi lists, or why it could not say (not installed, no driver loaded, no answer, output not understood). */
export async function nvidiaGpus(command = 'nvidia-smi', answerMs = ANSWER_MS): Promise<NvidiaGpu[] | { problem: string }> {
  const answer = await query(command, answerMs);
  if ('problem' in answer) return answer;
  return parseGpus(answer.stdout) ?? { problem: `nvidia-smi listed no GPU memory it could be read from (${JSON.stringify(answer.stdout.trim().slice(0, 200))})` };
}

/**
 * nvidia-smi's output, or why there is none, within `answerMs` by a timer of its own: execFile's
 * `timeout` kills the process but answers only once its output closes, which one that a driver holds
 * (a GPU fallen off the bus: even SIGKILL waits on the driver) or a wrapper script's child never does,
 * and the server's start waited with it.
 */
function query(command: string, answerMs: number): Promise<{ stdout: string } | { problem: string }> {
  return new Promise((resolve) => {
    const child = execFile(command, ['--query-gpu=index,uuid,memory.total,mig.mode.current', '--format=csv,noheader,nounits'], (err, stdout, stderr) => {
      clearTimeout(timer);
      if (!err || err.code === INFOROM_CORRUPTED) return resolve({ stdout });
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
