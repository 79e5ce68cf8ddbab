import { describe, expect, it } from 'vitest';
import { loadConfig, settingsHelp } from '../src/config.js';
import { ConfigError } from '../src/util/config-error.js';
import { codeBlockLines, codeSpans, DOCS, section, tableRows } from './helpers/docs.js';

/**
 * The settings tables users read (README.md's, and the tables of docs/ that repeat some settings) name
 * the settings src/config.ts reads, with the defaults `serve --help` shows and the bounds config.ts
 * holds them to; and every `SETTING=value` the docs write (`EXECUTION_PROVIDER=webgpu npm start`) is a
 * value the server takes. A setting added, renamed, given another default, bound or set of values
 * without its documentation fails here, naming it.
 */

/** A table row whose first cell is settings' variables only (`PORT`, or `S3_BUCKET`, `S3_PREFIX`), with its default and description cells. */
interface SettingRow {
  file: string;
  names: string[];
  defaults: string;
  description: string;
}

const SETTING_CELL = /^`[A-Z][A-Z0-9_]+`(, `[A-Z][A-Z0-9_]+`)*$/;

function settingRows(file: string, text: string): SettingRow[] {
  return tableRows(text)
    .filter(([first]) => SETTING_CELL.test(first))
    .map(([first, defaults, description = '']) => ({ file, names: first.split(', ').map((name) => name.replaceAll('`', '')), defaults, description }));
}

const readmeRows = settingRows('README.md', section(DOCS.get('README.md')!, '## Configuration'));
const allRows = [...DOCS].flatMap(([file, text]) => settingRows(file, text));
const settings = new Map(settingsHelp.map((setting) => [setting.env, setting]));

/** The problems config.ts finds with `value` for the setting `env` alone (not those across settings, which name others). */
function refusals(env: string, value: string): string[] {
  try {
    loadConfig({}, { [env]: value });
    return [];
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    return err.problems.filter((problem) => problem.startsWith(`${env} (`));
  }
}

const BYTE_UNITS: Record<string, number> = { k: 1024, m: 1024 ** 2, g: 1024 ** 3 };

describe('the settings tables of README.md and docs/', () => {
  it("README's table names every setting config.ts reads, each once", () => {
    const documented = readmeRows.flatMap((row) => row.names);
    expect(documented.length).toBeGreaterThan(40);
    expect(settingsHelp.map((s) => s.env).filter((env) => !documented.includes(env))).toEqual([]);
    expect(documented.filter((name, i) => documented.indexOf(name) !== i)).toEqual([]);
  });

  it('names no setting that config.ts does not read, in any table of the docs', () => {
    expect(allRows.flatMap((row) => row.names.filter((name) => !settings.has(name)).map((name) => `${row.file}: ${name}`))).toEqual([]);
  });

  it('gives each setting the default `serve --help` shows, where it shows one', () => {
    const wrong = allRows.flatMap(({ file, names, defaults }) => {
      // `S3_BUCKET`, `S3_PREFIX` | none, `images/`: one default each; else one for all of them.
      const cells = defaults.split(', ');
      return names.flatMap((name, i) => {
        const shown = settings.get(name)?.defaultText;
        const cell = (cells.length === names.length ? cells[i] : defaults).replaceAll('`', '');
        return shown === undefined || cell === shown ? [] : [`${file}: ${name} documented as '${cell}', serve --help says '${shown}'`];
      });
    });
    expect(allRows.filter((row) => row.file !== 'README.md').length).toBeGreaterThan(0);
    expect(wrong).toEqual([]);
  });

  it('gives the bounds config.ts holds each setting to: "1 to 64" takes 1 and 64 and refuses 0 and 65, "at least 64m" takes 64m and refuses a byte less', () => {
    const checked: string[] = [];
    const wrong = allRows
      .filter((row) => row.names.length === 1)
      .flatMap(({ file, names: [name], description }) => {
        const bounds = [
          ...[...description.matchAll(/\b(\d+) to (\d+)\b/g)].map(([, low, high]) => ({ takes: [low, high], refuses: [String(Number(high) + 1), ...(Number(low) > 0 ? [String(Number(low) - 1)] : [])] })),
          ...[...description.matchAll(/\bat least (\d+)([kmg])\b/g)].map(([, digits, unit]) => ({ takes: [`${digits}${unit}`], refuses: [String(Number(digits) * BYTE_UNITS[unit] - 1)] })),
        ];
        checked.push(...bounds.map(() => name));
        return bounds.flatMap(({ takes, refuses }) => [
          ...takes.filter((value) => refusals(name, value).length > 0).map((value) => `${file}: ${name}=${value} is refused: ${refusals(name, value).join('; ')}`),
          ...refuses.filter((value) => refusals(name, value).length === 0).map((value) => `${file}: ${name}=${value} is taken, past the bounds documented`),
        ]);
      });
    // WORKERS, WORKER_THREADS, WORKER_NICE, VAE_TILING, the byte sizes: the bounds the tables give.
    expect(new Set(checked).size).toBeGreaterThan(6);
    expect(wrong).toEqual([]);
  });
});

describe('the settings the docs set in their examples', () => {
  it('are values the settings take (a placeholder such as <key> aside)', () => {
    // NAME=value in a command line or a code span, the value up to a space or the span's end, or quoted.
    const examples = [...DOCS].flatMap(([file, text]) =>
      [...codeBlockLines(text), ...codeSpans(text)].flatMap((code) =>
        [...code.matchAll(/(?<![\w-])([A-Z][A-Z0-9_]+)=("[^"]*"|'[^']*'|[^\s"')]*)/g)]
          .filter(([, name]) => settings.has(name))
          .map(([, name, written]) => ({ file, name, value: written.replace(/^(["'])(.*)\1$/, '$2') })),
      ),
    );
    const wrong = examples.filter(({ value }) => !value.includes('<')).flatMap(({ file, name, value }) => refusals(name, value).map((problem) => `${file}: ${name}=${value}: ${problem}`));
    expect(examples.length).toBeGreaterThan(40);
    expect(wrong).toEqual([]);
  });
});
