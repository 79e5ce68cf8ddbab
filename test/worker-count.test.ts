import { describe, expect, it } from 'vitest';
import { defaultWorkerCount, workersSharingADevice } from '../src/engine/worker-count.js';

const GiB = 2 ** 30;
const sd15 = { dir: '/models/sd15' };

describe('the default number of workers', () => {
  it('is one on the CPU, one per CUDA device and one on WebGPU when nothing was measured', () => {
    expect(defaultWorkerCount({ provider: 'cpu', cudaDevices: [0], preload: [sd15], measured: {}, availableBytes: 64 * GiB }).workers).toBe(1);
    expect(defaultWorkerCount({ provider: 'cuda', cudaDevices: [0, 1, 2], preload: [sd15], measured: {}, availableBytes: 64 * GiB }).workers).toBe(3);
    // CUDA_DEVICES is CUDA's: WebGPU runs on the one adapter it finds.
    expect(defaultWorkerCount({ provider: 'webgpu', cudaDevices: [0, 1, 2], preload: [sd15], measured: {}, availableBytes: 64 * GiB })).toMatchObject({ workers: 1, reason: expect.stringMatching(/GPU/) });
  });

  it('is no more than the measured memory of the preloaded models lets fit, and never less than one', () => {
    const measured = { [sd15.dir]: { weightsBytes: 4 * GiB, peakBytes: 8 * GiB, peakPixels: 2 * 512 * 512 } };
    const fits = (availableBytes: number) => defaultWorkerCount({ provider: 'cuda', cudaDevices: [0, 1, 2, 3], preload: [sd15], measured, availableBytes });
    expect(fits(100 * GiB).workers).toBe(4);
    expect(fits(30 * GiB)).toMatchObject({ workers: 2, reason: expect.stringMatching(/measured 12\.0 GiB a worker and 30\.0 GiB is free/) });
    expect(fits(5 * GiB).workers).toBe(1);
  });

  it('counts no figures measured of another model once installed in a preloaded folder (another version of its files)', () => {
    const measured = { [sd15.dir]: { weightsBytes: 4 * GiB, peakBytes: 8 * GiB, peakPixels: 2 * 512 * 512, version: 'sdxl-files' } };
    const fits = (version: string) => defaultWorkerCount({ provider: 'cuda', cudaDevices: [0, 1, 2, 3], preload: [{ ...sd15, version }], measured, availableBytes: 30 * GiB }).workers;
    expect(fits('sdxl-files')).toBe(2);
    expect(fits('sd15-files')).toBe(4);
  });
});

describe('the workers that share a CUDA device', () => {
  it('are counted on the device that has the most, worker i on device i mod their count', () => {
    expect(workersSharingADevice(1, [0])).toBe(1);
    expect(workersSharingADevice(2, [0, 1, 2])).toBe(1);
    expect(workersSharingADevice(3, [0, 1])).toBe(2);
    // A device named twice takes two workers of three, where dividing workers by names said one.
    expect(workersSharingADevice(3, [0, 0, 1])).toBe(2);
    expect(workersSharingADevice(4, [1, 1])).toBe(4);
  });
});
