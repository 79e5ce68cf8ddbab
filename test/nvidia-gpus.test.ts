import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { nvidiaGpus, parseGpuMemory } from '../src/runtime/nvidia-gpus.js';

describe("the GPUs' memory from nvidia-smi", () => {
  it('reads one "index, MiB" line per GPU and keeps the smallest', () => {
    expect(parseGpuMemory('0, 81559\n1, 24564\n')).toEqual({ count: 2, smallestBytes: 24564 * 1024 ** 2 });
    expect(parseGpuMemory('0, 16376\r\n')).toEqual({ count: 1, smallestBytes: 16376 * 1024 ** 2 });
  });

  it('reads nothing from output that is not that (no GPU, a driver error, a field it cannot read)', () => {
    expect(parseGpuMemory('')).toBeUndefined();
    expect(parseGpuMemory('No devices were found\n')).toBeUndefined();
    expect(parseGpuMemory('0, [N/A]\n')).toBeUndefined();
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
