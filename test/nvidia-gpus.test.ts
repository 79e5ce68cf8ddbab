import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { gpusInUse, nvidiaGpus, parseGpus } from '../src/runtime/nvidia-gpus.js';

const MIB = 1024 ** 2;
const A = 'GPU-8e5c0b7a-1111-2222-3333-444455556666';
const B = 'GPU-0f3d9c21-aaaa-bbbb-cccc-ddddeeeeffff';
/** A workstation as nvidia-smi lists it: an 80 GiB GPU on the first bus, an 8 GiB display card on the second. */
const workstation = parseGpus(`0, ${A}, 81559, Disabled\n1, ${B}, 8192, [N/A]\n`)!;

describe("the GPUs' memory from nvidia-smi", () => {
  it('reads one "index, uuid, MiB, MIG mode" line per GPU', () => {
    expect(workstation).toEqual([
      { index: 0, uuid: A, memoryBytes: 81559 * MIB, mig: false },
      { index: 1, uuid: B, memoryBytes: 8192 * MIB, mig: false },
    ]);
    expect(parseGpus(`0, ${A}, 16376, Enabled\r\n`)).toEqual([{ index: 0, uuid: A, memoryBytes: 16376 * MIB, mig: true }]);
  });

  it('reads nothing from output that is not that (no GPU, a driver error, a field it cannot read)', () => {
    expect(parseGpus('')).toBeUndefined();
    expect(parseGpus('No devices were found\n')).toBeUndefined();
    expect(parseGpus(`0, ${A}, [N/A], Disabled\n`)).toBeUndefined();
    expect(parseGpus(`0, ${A}, 81559, Disabled\n1, [Unknown Error]\n`)).toBeUndefined();
  });

  it("counts the GPUs CUDA_DEVICES gives the workers where CUDA's numbering can be told: by UUID, or in the PCI bus's order", () => {
    const [big, small] = workstation;
    expect(gpusInUse(workstation, [0], { CUDA_VISIBLE_DEVICES: B })).toEqual({ gpus: [small], exact: true });
    // A prefix of the UUID is enough for CUDA; the order is CUDA_VISIBLE_DEVICES's.
    expect(gpusInUse(workstation, [1], { CUDA_VISIBLE_DEVICES: `${B}, ${A.slice(0, 12)}` })).toEqual({ gpus: [big], exact: true });
    expect(gpusInUse(workstation, [0], { CUDA_DEVICE_ORDER: 'PCI_BUS_ID' })).toEqual({ gpus: [big], exact: true });
    expect(gpusInUse(workstation, [0], { CUDA_DEVICE_ORDER: 'PCI_BUS_ID', CUDA_VISIBLE_DEVICES: '1' })).toEqual({ gpus: [small], exact: true });
    expect(gpusInUse(workstation, [1, 0], { CUDA_DEVICE_ORDER: 'PCI_BUS_ID' })).toEqual({ gpus: [small, big], exact: true });
  });

  it('counts every GPU a device could be where CUDA numbers them fastest first, which nvidia-smi cannot tell', () => {
    const [big, small] = workstation;
    expect(gpusInUse(workstation, [0], {})).toEqual({ gpus: [small, big], exact: false });
    expect(gpusInUse(workstation, [0], { CUDA_VISIBLE_DEVICES: '0' })).toEqual({ gpus: [small, big], exact: false });
    // One GPU has one numbering.
    expect(gpusInUse([big], [0], {})).toEqual({ gpus: [big], exact: true });
  });

  it('stops at the first CUDA_VISIBLE_DEVICES entry CUDA cannot use, as CUDA does, and says when the devices name no GPU', () => {
    const [big] = workstation;
    expect(gpusInUse(workstation, [0, 1], { CUDA_VISIBLE_DEVICES: `${A},7,${B}` })).toEqual({ gpus: [big], exact: true });
    expect(gpusInUse(workstation, [0], { CUDA_VISIBLE_DEVICES: '' })).toBeUndefined();
    expect(gpusInUse(workstation, [2], {})).toBeUndefined();
  });

  it('says a MIG instance named in CUDA_VISIBLE_DEVICES is one (CUDA runs on it; nvidia-smi gives only its whole GPU\'s memory), rather than no device', () => {
    const mig = 'MIG-5a1b2c3d-0000-1111-2222-333344445555';
    // Before, CUDA was taken to stop at it, and the log said CUDA_DEVICES named no GPU.
    expect(gpusInUse(workstation, [0], { CUDA_VISIBLE_DEVICES: mig })).toEqual({ migInstance: mig });
    expect(gpusInUse(workstation, [1], { CUDA_VISIBLE_DEVICES: `${A},MIG-GPU-${B.slice(4)}/1/0` })).toEqual({ migInstance: `MIG-GPU-${B.slice(4)}/1/0` });
    // A device after it is still told by its own entry.
    expect(gpusInUse(workstation, [1], { CUDA_VISIBLE_DEVICES: `${mig},${B}` })).toEqual({ gpus: [workstation[1]], exact: true });
    expect(gpusInUse(workstation, [1], { CUDA_VISIBLE_DEVICES: mig })).toBeUndefined();
  });

  it('says why when it cannot be run, or answers what it cannot read', async () => {
    expect(await nvidiaGpus(path.join(os.tmpdir(), 'no-such-nvidia-smi'))).toEqual({ problem: expect.stringMatching(/^nvidia-smi could not be run \(.*ENOENT/) });
    const dir = await mkdtemp(path.join(os.tmpdir(), 'nvidia-smi-'));
    try {
      const failing = path.join(dir, 'nvidia-smi');
      // As it fails where no driver is loaded: its reason on stdout, exit status 9.
      await writeFile(failing, '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n', { mode: 0o755 });
      expect(await nvidiaGpus(failing)).toEqual({ problem: "nvidia-smi could not be run (NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.)" });
      const unreadable = path.join(dir, 'unreadable');
      await writeFile(unreadable, '#!/bin/sh\necho "0, [N/A]"\n', { mode: 0o755 });
      expect(await nvidiaGpus(unreadable)).toEqual({ problem: 'nvidia-smi listed no GPU memory it could be read from ("0, [N/A]")' });
      // What it is asked: the command line the fake answers is the one the real nvidia-smi is given.
      const echoing = path.join(dir, 'echoing');
      await writeFile(echoing, `#!/bin/sh\n[ "$*" = "--query-gpu=index,uuid,memory.total,mig.mode.current --format=csv,noheader,nounits" ] && echo "0, ${A}, 24564, [N/A]"\n`, { mode: 0o755 });
      expect(await nvidiaGpus(echoing)).toEqual([{ index: 0, uuid: A, memoryBytes: 24564 * MIB, mig: false }]);
      // A GPU whose infoROM is corrupted still works: nvidia-smi lists it with a warning and exit status
      // 14, read before as a failure to run (the budget fell back to RAM's share). Another failure's
      // listing may lack a GPU, and is not read.
      const warning = path.join(dir, 'warning');
      await writeFile(warning, `#!/bin/sh\necho "0, ${A}, 24564, [N/A]"\necho "WARNING: infoROM is corrupted at gpu 0000:01:00.0"\nexit 14\n`, { mode: 0o755 });
      expect(await nvidiaGpus(warning)).toEqual([{ index: 0, uuid: A, memoryBytes: 24564 * MIB, mig: false }]);
      const partial = path.join(dir, 'partial');
      await writeFile(partial, `#!/bin/sh\necho "0, ${A}, 24564, [N/A]"\necho "Unable to determine the device handle for GPU 0000:02:00.0: Unknown Error"\nexit 15\n`, { mode: 0o755 });
      expect(await nvidiaGpus(partial)).toEqual({ problem: expect.stringMatching(/^nvidia-smi could not be run/) });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('gives up on an nvidia-smi that does not answer, as one held by a driver that lost its GPU', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'nvidia-smi-'));
    const pidFile = path.join(dir, 'pid');
    try {
      // Deaf to SIGTERM, and its output held open by a child, as no kill can end one the driver holds:
      // before, the server's start waited the minute out (execFile's timeout answers when the output closes).
      const hung = path.join(dir, 'nvidia-smi');
      await writeFile(hung, `#!/bin/sh\ntrap '' TERM\nsleep 60 &\necho $! > '${pidFile}'\nwait\n`, { mode: 0o755 });
      expect(await nvidiaGpus(hung, 1000)).toEqual({ problem: expect.stringMatching(/^nvidia-smi did not answer within 1 s \(.*Xid/) });
    } finally {
      // Its child, which outlives it and ignores SIGTERM as it does (no file if the script was killed before it started one).
      await readFile(pidFile, 'utf8').then((pid) => process.kill(Number(pid), 'SIGKILL'), () => undefined);
      await rm(dir, { recursive: true, force: true });
    }
  }, 120_000);
});
