import { ApiError } from '../api/errors.js';
import { ModelUsageError } from '../install/errors.js';
import { ConfigError } from '../util/config-error.js';
import { GoldenFileError } from './golden-error.js';

/**
 * Every command's exit status for a failure, as the README promises: 2 for what it was given (a flag or
 * argument it refuses, a setting, a golden file it cannot use), as commander's own usage errors; 1 for
 * work that failed (a model that does not load or run, a download, a disk). One rule for all commands.
 */

/** A flag or argument a command refuses before any work. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

/** 2 for an error about what the command was given, 1 for any other. */
export function exitStatusOf(err: unknown): 1 | 2 {
  const given =
    err instanceof UsageError ||
    err instanceof ConfigError ||
    err instanceof ModelUsageError ||
    err instanceof GoldenFileError ||
    // The request's own checks (generate): a field the API would answer with a 4xx.
    (err instanceof ApiError && err.status < 500);
  return given ? 2 : 1;
}
