import { describe, expect, it } from 'vitest';
import { darwinAvailableBytes, vmStatAvailableBytes } from '../src/runtime/darwin-memory.js';

/**
 * macOS memory for the plan: free plus inactive pages from `vm_stat`, as os.freemem() there counts only
 * pages no one holds. Only the reading of its output can run here (Linux); the command is macOS's.
 */

/** `vm_stat` as macOS 14 on Apple silicon prints it (16 KiB pages; a machine that has run a while: few free pages). */
const APPLE_SILICON = `Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                                3867.
Pages active:                            337153.
Pages inactive:                          333468.
Pages speculative:                         2622.
Pages throttled:                              0.
Pages wired down:                        137218.
Pages purgeable:                          16347.
"Translation faults":                 796151906.
Pages copy-on-write:                   18330406.
Pages zero filled:                    327378898.
Pages reactivated:                     14880862.
Pages purged:                           4176530.
File-backed pages:                       234497.
Anonymous pages:                         438746.
Pages stored in compressor:              617116.
Pages occupied by compressor:            194291.
Decompressions:                        27339596.
Compressions:                          38108046.
Pageins:                               11357006.
Pageouts:                                174040.
Swapins:                                 690497.
Swapouts:                               1060165.
`;

describe("macOS's available memory", () => {
  it('counts free, speculative and inactive pages at the page size the header names', () => {
    expect(vmStatAvailableBytes(APPLE_SILICON)).toBe((3867 + 2622 + 333468) * 16384);
    // Intel Macs' 4 KiB pages.
    expect(vmStatAvailableBytes(APPLE_SILICON.replace('16384 bytes', '4096 bytes'))).toBe((3867 + 2622 + 333468) * 4096);
  });

  it('gives no figure for text that lacks the page size or a count it needs', () => {
    expect(vmStatAvailableBytes(APPLE_SILICON.replace(/^Mach.*\n/, ''))).toBeUndefined();
    expect(vmStatAvailableBytes(APPLE_SILICON.replace(/^Pages inactive.*\n/m, ''))).toBeUndefined();
    expect(vmStatAvailableBytes('')).toBeUndefined();
  });

  it.runIf(process.platform !== 'darwin')('gives no figure where vm_stat does not exist, so the portable one is used', () => {
    expect(darwinAvailableBytes()).toBeUndefined();
  });
});
