import { existsSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { PROJECT_ROOT } from './helpers/cli.js';
import { DOCS, withoutCodeBlocks } from './helpers/docs.js';

/**
 * The links between README.md and docs/*.md lead somewhere: each relative link names a file of the
 * repository, and each #anchor a heading of its page. A heading reworded, a section moved to another
 * page or a file renamed without its links fails here, naming the link; on GitHub it would open the top
 * of the page, or a 404.
 */

/** GitHub's anchor of a heading: lower case, markup and punctuation dropped (hyphens and underscores kept), spaces as hyphens. */
const anchorOf = (heading: string): string =>
  heading
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');

/** A page's anchors, a repeated heading's numbered as GitHub numbers them (-1, -2, ...). */
function anchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  return new Set(
    [...withoutCodeBlocks(text).matchAll(/^#{1,6} +(.+?) *$/gm)].map(([, heading]) => {
      const anchor = anchorOf(heading);
      const times = seen.get(anchor) ?? 0;
      seen.set(anchor, times + 1);
      return times === 0 ? anchor : `${anchor}-${times}`;
    }),
  );
}

/** Each page's links to the repository's own files and headings (not web addresses), as written. */
const links = [...DOCS].flatMap(([file, text]) =>
  [...withoutCodeBlocks(text).replace(/`[^`\n]*`/g, '').matchAll(/\]\(([^)\s]+)\)/g)]
    .map(([, target]) => target)
    .filter((target) => !/^[a-z]+:/.test(target))
    .map((target) => ({ file, target })),
);

describe('the links of README.md and docs/', () => {
  it('name files of the repository', () => {
    const missing = links.filter(({ file, target }) => {
      const [to] = target.split('#');
      return to !== '' && !existsSync(path.join(PROJECT_ROOT, path.dirname(file), to));
    });
    expect(links.length).toBeGreaterThan(30);
    expect(missing.map(({ file, target }) => `${file}: ${target}`)).toEqual([]);
  });

  it('name headings of their pages by their anchors', () => {
    const withAnchor = links.filter(({ target }) => target.includes('#'));
    const broken = withAnchor.filter(({ file, target }) => {
      const [to, anchor] = target.split('#');
      const page = to === '' ? file : path.join(path.dirname(file), to);
      // A link into a file that is not a page (a source file's line) has no headings to check.
      return page.endsWith('.md') && !anchors(DOCS.get(page) ?? '').has(anchor);
    });
    expect(withAnchor.length).toBeGreaterThan(20);
    expect(broken.map(({ file, target }) => `${file}: ${target}`)).toEqual([]);
  });
});
