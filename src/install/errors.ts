/**
 * Failures of model installs. Their messages are shown to the user as they are, so each one says what
 * went wrong and what to do next; the CLI prints them without a stack trace.
 */
export class ModelInstallError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ModelInstallError';
  }
}

/**
 * An argument the command refuses before any work (a repository name, a model id, a --subfolder, no
 * models folder): a usage error, which the CLI exits with 2 for, as for an unknown flag.
 */
export class ModelUsageError extends ModelInstallError {
  constructor(message: string) {
    super(message);
    this.name = 'ModelUsageError';
  }
}

/** A download stopped part-way; what arrived is kept so that running the same pull again resumes it. */
export class DownloadInterrupted extends ModelInstallError {
  constructor(message: string) {
    super(message);
    this.name = 'DownloadInterrupted';
  }
}
