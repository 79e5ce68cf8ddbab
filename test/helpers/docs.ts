import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { PROJECT_ROOT } from './cli.js';

/**
 * The documentation users read, README.md and docs/*.md, as the tests that hold it to the code read it
 * (settings-docs, docs-links, api-docs, docs-commands): each file's text by its path from the root.
 */
export const DOCS: ReadonlyMap<string, string> = new Map(
  ['README.md', ...readdirSync(path.join(PROJECT_ROOT, 'docs')).filter((name) => name.endsWith('.md')).map((name) => path.join('docs', name))].map((file) => [
    file,
    readFileSync(path.join(PROJECT_ROOT, file), 'utf8'),
  ]),
);

/** A document's text with its fenced code blocks blanked: their lines are commands and code, not prose or links. */
export const withoutCodeBlocks = (text: string): string => text.replace(/^ *```[\s\S]*?^ *```/gm, '');

/** The lines of a document's fenced code blocks (shell commands, configurations, code). */
export const codeBlockLines = (text: string): string[] => [...text.matchAll(/^ *```[^\n]*\n([\s\S]*?)^ *```/gm)].flatMap((block) => block[1].split('\n'));

/** A document's inline code spans outside its code blocks (`imagegen models list`, `PORT=0`). */
export const codeSpans = (text: string): string[] => [...withoutCodeBlocks(text).matchAll(/`([^`\n]+)`/g)].map((span) => span[1]);

/** The section under `heading` (a whole heading line, e.g. '## Errors'), up to the next heading of its level or above; code blocks left out. */
export function section(text: string, heading: string): string {
  const prose = withoutCodeBlocks(text);
  const start = prose.indexOf(`\n${heading}\n`);
  if (start < 0) throw new Error(`no section '${heading}'`);
  const next = new RegExp(`\\n#{1,${heading.indexOf(' ')}} `, 'g');
  next.lastIndex = start + heading.length + 1;
  return prose.slice(start, next.exec(prose)?.index);
}

/** The cells of each body row of the tables in `text` (lines starting '| ', the rule rows left out); an empty cell is ''. */
export const tableRows = (text: string): string[][] =>
  text
    .split('\n')
    .filter((line) => line.startsWith('| ') && !line.startsWith('|---'))
    .map((line) => ` ${line.slice(1).replace(/ \|$/, '')}`.split(/ \|(?= )/).map((cell) => cell.trim()));
