import type { Snippets } from './snippets.js';

/** The "copy as code" dialog: each snippet shown, and copied to the clipboard with its button. */

const LANGUAGES: [keyof Snippets, string][] = [
  ['curl', 'curl'],
  ['python', 'Python (openai)'],
  ['node', 'Node (openai)'],
];

/** The clipboard API needs a secure context (https or loopback); elsewhere the text is selected for Ctrl+C. */
async function copy(text: string, block: HTMLElement, status: HTMLElement): Promise<void> {
  try {
    await navigator.clipboard.writeText(text);
    status.textContent = 'Copied.';
  } catch {
    getSelection()?.selectAllChildren(block);
    status.textContent = 'Selected: press Ctrl+C (or Cmd+C) to copy; this page may not write to the clipboard.';
  }
}

/** A file the snippets read (an edit's picture and mask), offered for download beside them. */
export interface SnippetFile {
  name: string;
  blob: Blob;
}

export function showCode(dialog: HTMLDialogElement, snippets: Snippets, note: string, files: readonly SnippetFile[] = []): void {
  dialog.querySelector('#code-note')!.textContent = note;
  const downloads = dialog.querySelector('#code-files')!;
  for (const link of downloads.querySelectorAll('a')) URL.revokeObjectURL(link.href);
  downloads.replaceChildren(
    ...files.map(({ name, blob }) => Object.assign(document.createElement('a'), { href: URL.createObjectURL(blob), download: name, textContent: `Download ${name}` })),
  );
  const blocks = LANGUAGES.map(([key, title]) => {
    const section = document.createElement('section');
    const heading = Object.assign(document.createElement('h3'), { textContent: title, id: `code-${key}-title` });
    const code = Object.assign(document.createElement('pre'), { textContent: snippets[key], id: `code-${key}`, tabIndex: 0 });
    code.setAttribute('aria-labelledby', heading.id);
    const status = Object.assign(document.createElement('span'), { role: 'status' });
    const button = Object.assign(document.createElement('button'), { type: 'button', textContent: `Copy ${title}` });
    button.dataset.copy = key;
    button.addEventListener('click', () => void copy(snippets[key], code, status));
    section.append(heading, code, button, status);
    return section;
  });
  dialog.querySelector('#code-blocks')!.replaceChildren(...blocks);
  dialog.showModal();
}
