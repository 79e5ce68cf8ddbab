/** Installing models into the models folder: `imagegen models pull | import | export | list | remove`. */
export { MANIFEST_FILE } from './constants.js';
export { realDisk, type Disk, type FileWriter } from './disk.js';
export { DownloadInterrupted, ModelInstallError, ModelUsageError } from './errors.js';
export { exportModel, type ExportedBundle, type ExportOptions } from './export-model.js';
export { importModel, type ImportOptions } from './import-model.js';
export { removeModel, type CommandOptions, type InstalledModel, type Removed } from './installer.js';
export { listModels, type ModelStatus } from './list.js';
export { pullModel, type PullOptions } from './pull.js';
export type { ProgressOutput } from '../util/progress.js';
