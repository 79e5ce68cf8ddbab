import { spawnSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';

/**
 * What macOS can still give. Node's os.freemem() there counts only the pages no one holds, which on a
 * Mac that has run for a while is a few hundred MiB however much the file cache and inactive pages
 * could give back, so planning on it refused models that fit. The figure here is the one psutil and
 * Zabbix use for macOS (free pages plus inactive ones), read from `vm_stat`, which every macOS has.
 * Kept here rather than taken from a library: the plan needs the figure synchronously, a few times per
 * batch, and the libraries that have it (systeminformation) read it asynchronously through two commands.
 */

/** How long one reading serves: the plan asks a few times per batch, and `vm_stat` takes milliseconds to run. */
const FRESH_MS = 1000;

let last: { at: number; bytes: number | undefined } | undefined;

/** Free plus inactive memory, from `vm_stat`; undefined where it cannot be run or read (not macOS). */
export function darwinAvailableBytes(): number | undefined {
  const now = performance.now();
  if (last && now - last.at < FRESH_MS) return last.bytes;
  const result = spawnSync('vm_stat', { encoding: 'utf8', timeout: 2000 });
  last = { at: now, bytes: result.status === 0 ? vmStatAvailableBytes(result.stdout) : undefined };
  return last.bytes;
}

/**
 * Free plus inactive bytes in `vm_stat`'s output: a header naming the page size ("Mach Virtual Memory
 * Statistics: (page size of 16384 bytes)"), then one `Pages <kind>: <count>.` line per kind. Its "Pages
 * free" leaves out the speculative pages (read-ahead file cache), which it lists on a line of their
 * own; they are added back, as the kernel's own free count (what os.freemem() reads) includes them.
 */
export function vmStatAvailableBytes(text: string): number | undefined {
  const pageSize = /page size of (\d+) bytes/.exec(text)?.[1];
  const pages = (kind: string) => new RegExp(`^Pages ${kind}:\\s+(\\d+)\\.?$`, 'm').exec(text)?.[1];
  const [free, inactive, speculative] = [pages('free'), pages('inactive'), pages('speculative')];
  if (pageSize === undefined || free === undefined || inactive === undefined) return undefined;
  return (Number(free) + Number(inactive) + Number(speculative ?? 0)) * Number(pageSize);
}
