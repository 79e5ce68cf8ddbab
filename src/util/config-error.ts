/**
 * Settings that cannot be used, each problem a line: what src/config.ts finds as it reads them, and what
 * a lower layer finds only as it starts (the S3 store's region, which the AWS SDK resolves). The
 * commands exit 2 for it, as for any usage error. Here, below every layer, so that both may throw it.
 */
export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`Invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}
