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

/** A download stopped part-way; what arrived is kept so that running the same pull again resumes it. */
export class DownloadInterrupted extends ModelInstallError {
  constructor(message: string) {
    super(message);
    this.name = 'DownloadInterrupted';
  }
}

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** 1536 -> "1.5 KiB". */
export function formatBytes(bytes: number): string {
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${UNITS[unit]}`;
}
