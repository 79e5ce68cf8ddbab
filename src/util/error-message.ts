import { inspect } from 'node:util';

/**
 * What a caught value says, for a message built around it. `(err as Error).message` is undefined when
 * what was thrown is no Error (a string, a rejected promise's plain object), and the user then read
 * "(undefined)" where the reason belonged. Node fails a connection to a name with several addresses
 * (localhost: 127.0.0.1 and ::1) with an AggregateError whose own message is empty: its reasons are
 * its errors', one per address.
 */
export function messageOf(err: unknown): string {
  if (err instanceof AggregateError && err.message === '' && err.errors.length > 0) return err.errors.map(messageOf).join('; ');
  if (err instanceof Error) return err.message;
  return typeof err === 'string' ? err : inspect(err);
}

/** The first line of what a caught value says: onnxruntime's and the system's messages go on with source locations and stacks. */
export const firstLineOf = (err: unknown): string => messageOf(err).split('\n')[0];

/**
 * A system error's code (ENOENT, EROFS: short, and what an operator searches for), or else what the
 * value says: the reason in a message about a file or folder that could not be used.
 */
export const codeOrMessage = (err: unknown): string => (err as NodeJS.ErrnoException | undefined)?.code ?? messageOf(err);

/**
 * Why a file to be read could not be, in words to put after its name: the system's own message
 * ("ENOENT: no such file or directory, open '…'") names the call that failed rather than the problem,
 * and for a folder (EISDIR) not even the path. Callers add what to do, which only they know.
 */
export function whyUnreadable(err: unknown): string {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return code === 'ENOENT' ? 'does not exist' : code === 'EISDIR' ? 'is a folder' : `cannot be read (${codeOrMessage(err)})`;
}
