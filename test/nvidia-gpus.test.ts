import { mkdtemp, rm, writeFile } from 'node:fs/promises';
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
});
