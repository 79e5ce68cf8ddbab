import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { registerGenerateCommand } from '../src/cli/generate.js';
import { registerModelCommands } from '../src/cli/models.js';
import { settingsHelp } from '../src/config.js';
import { PROJECT_ROOT } from './helpers/cli.js';
import { codeBlockLines, codeSpans, DOCS } from './helpers/docs.js';

/**
 * The commands the docs tell users to type exist as written: each `imagegen ...` (or `models ...`)
 * names commands the CLI has and flags those commands take, and each `npm run <script>` a script of
 * package.json. A flag or script renamed without the docs that show it fails here, naming the line;
 * a user would meet "unknown option" or "Missing script".
 */

/** The imagegen command as src/cli/main.ts builds it: serve with a flag per setting, generate, models and its subcommands. */
function imagegen(): Command {
  const program = new Command('imagegen');
  const serve = program.command('serve');
  for (const setting of settingsHelp) serve.option(`${setting.flag} <value>`);
  registerGenerateCommand(program);
  registerModelCommands(program);
  return program;
}

/** Every piece of code in the docs (a line of a code block, an inline code span), with its file. */
const code = [...DOCS].flatMap(([file, text]) => [...codeBlockLines(text), ...codeSpans(text)].map((line) => ({ file, line })));

describe('the commands in README.md and docs/', () => {
  it('name imagegen commands and flags that exist', () => {
    const program = imagegen();
    const invocations = code.flatMap(({ file, line }) =>
      // Up to a comment or the next shell command; `models import --force` in prose is imagegen's too.
      [...line.matchAll(/(?:^|[\s(])(?:imagegen\s+)?((?:serve|generate|models)\b[^#;|&`]*)/g)].map(([, words]) => ({ file, words: words.trim().split(/\s+/) })),
    );
    const wrong = invocations.flatMap(({ file, words }) => {
      let command = program;
      let at = 0;
      for (; at < words.length; at++) {
        const sub = command.commands.find((c) => c.name() === words[at]);
        if (!sub) break;
        command = sub;
      }
      const flags = words.slice(at).filter((word) => word.startsWith('--') && word !== '--help');
      return flags.filter((flag) => !command.options.some((option) => option.long === flag.replace(/=.*/, ''))).map((flag) => `${file}: ${words.join(' ')}: ${flag}`);
    });
    expect(invocations.filter(({ words }) => words.some((word) => word.startsWith('--'))).length).toBeGreaterThan(5);
    expect(wrong).toEqual([]);
  });

  it('run npm scripts that package.json has', () => {
    const { scripts } = JSON.parse(readFileSync(path.join(PROJECT_ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
    const named = code.flatMap(({ file, line }) => [...line.matchAll(/\bnpm run ([\w:-]+)/g)].map(([, script]) => ({ file, script })));
    expect(named.length).toBeGreaterThan(10);
    expect(named.filter(({ script }) => !Object.hasOwn(scripts, script)).map(({ file, script }) => `${file}: npm run ${script}`)).toEqual([]);
  });
});
