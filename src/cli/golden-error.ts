/** A golden file that cannot be used as it is (`models verify` exits 2, as for an argument it refuses). */
export class GoldenFileError extends Error {
  constructor(file: string, problem: string) {
    super(`${file}: ${problem}`);
    this.name = 'GoldenFileError';
  }
}
