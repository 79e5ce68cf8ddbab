import { mkdir, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

/**
 * The suite's one table: every row a measurement against its baseline, taken side by side in the same
 * run, with the goal beside it. Rows print as they come (a long run shows progress) and again
 * together at the end, and go to a JSON file so that runs can be compared.
 */

export interface Row {
  /** What is measured, e.g. "HTTP vs in-process". */
  group: string;
  /** Which case, e.g. "url n=10 1024x1024". */
  case: string;
  /** The baseline's figure, with its unit. */
  baseline: string;
  /** The measured figure, with its unit. */
  measured: string;
  /** measured / baseline (or the share of a whole, for the stage split). */
  ratio?: number;
  /** The goal, in words, e.g. "<= 1.05". */
  goal?: string;
  /** Whether the goal is met; undefined where a row has no goal of its own. */
  met?: boolean;
}

/** A skipped measurement: printed with its reason, kept in the JSON. */
export interface Skipped {
  group: string;
  reason: string;
}

const COLUMNS: { title: string; width: number; cell(row: Row): string }[] = [
  { title: 'measurement', width: 24, cell: (r) => r.group },
  { title: 'case', width: 44, cell: (r) => r.case },
  { title: 'baseline', width: 20, cell: (r) => r.baseline },
  { title: 'measured', width: 20, cell: (r) => r.measured },
  { title: 'ratio', width: 8, cell: (r) => (r.ratio === undefined ? '' : `x${r.ratio.toFixed(3)}`) },
  { title: 'goal', width: 12, cell: (r) => r.goal ?? '' },
  { title: 'met', width: 3, cell: (r) => (r.met === undefined ? '' : r.met ? 'yes' : 'NO') },
];

/** One row, its columns at least `widths` wide (the defaults while rows stream in). */
export function formatRow(row: Row, widths = COLUMNS.map((c) => c.width)): string {
  return COLUMNS.map((c, i) => c.cell(row).padEnd(widths[i])).join(' | ').trimEnd();
}

/** The rows with every column as wide as its widest cell. */
export function formatTable(rows: readonly Row[], skipped: readonly Skipped[]): string {
  const widths = COLUMNS.map((c) => Math.max(c.title.length, ...rows.map((r) => c.cell(r).length)));
  const head = COLUMNS.map((c, i) => c.title.padEnd(widths[i])).join(' | ');
  const lines = [head, widths.map((w) => '-'.repeat(w)).join('-|-'), ...rows.map((r) => formatRow(r, widths))];
  for (const s of skipped) lines.push(`skipped: ${s.group}: ${s.reason}`);
  return lines.join('\n');
}

/** Writes the run's rows with what machine and settings produced them; answers the file's path. */
export async function writeResults(file: string | undefined, rows: readonly Row[], skipped: readonly Skipped[], settings: object): Promise<string> {
  const now = new Date();
  const target = file ?? path.join('bench', 'results', `${now.toISOString().replace(/[:.]/g, '-')}.json`);
  await mkdir(path.dirname(target), { recursive: true });
  const machine = { cpus: os.cpus()[0]?.model, cores: os.availableParallelism(), memoryBytes: os.totalmem(), node: process.version, platform: `${os.platform()} ${os.release()}` };
  await writeFile(target, `${JSON.stringify({ date: now.toISOString(), machine, settings, rows, skipped }, null, 2)}\n`);
  return target;
}
