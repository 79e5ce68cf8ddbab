import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { settingsHelp } from '../src/config.js';

/**
 * The settings tables users read (README.md's, and the tables of docs/ that repeat some settings) name
 * the settings src/config.ts reads, with the defaults `serve --help` shows: a setting added, renamed or
 * given another default without its documentation fails here, naming it.
 */

const ROOT = path.resolve(import.meta.dirname, '..');
const DOCS = ['README.md', ...readdirSync(path.join(ROOT, 'docs')).filter((name) => name.endsWith('.md')).map((name) => path.join('docs', name))];

/** A table row whose first cell is settings' variables only (`PORT`, or `S3_BUCKET`, `S3_PREFIX`), with its default cell. */
interface SettingRow {
  file: string;
  names: string[];
  defaults: string;
}

const SETTING_CELL = /^`[A-Z][A-Z0-9_]+`(, `[A-Z][A-Z0-9_]+`)*$/;

function settingRows(file: string, text: string): SettingRow[] {
  return text
    .split('\n')
    .filter((line) => line.startsWith('| `'))
    .map((line) => line.split(' | ').map((cell) => cell.replace(/^\| /, '').trim()))
    .filter(([first]) => SETTING_CELL.test(first))
    .map(([first, defaults]) => ({ file, names: first.split(', ').map((name) => name.replaceAll('`', '')), defaults }));
}

/** README.md's section `## Configuration`, which documents every setting. */
function configurationSection(readme: string): string {
  const start = readme.indexOf('\n## Configuration\n');
  expect(start, "README.md's '## Configuration' section").toBeGreaterThan(0);
  const end = readme.indexOf('\n## ', start + 1);
  return readme.slice(start, end < 0 ? undefined : end);
}

const readme = readFileSync(path.join(ROOT, 'README.md'), 'utf8');
const readmeRows = settingRows('README.md', configurationSection(readme));
const allRows = DOCS.flatMap((file) => settingRows(file, readFileSync(path.join(ROOT, file), 'utf8')));
const settings = new Map(settingsHelp.map((setting) => [setting.env, setting]));

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
});
