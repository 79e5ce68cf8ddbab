import { inspect } from 'node:util';

/**
 * What a caught value says, for a message built around it. `(err as Error).message` is undefined when
 * what was thrown is no Error (a string, a rejected promise's plain object), and the user then read
 * "(undefined)" where the reason belonged.
 */
export function messageOf(err: unknown): string {
  if (err instanceof Error) return err.message;
  return typeof err === 'string' ? err : inspect(err);
}
