import { constants } from 'node:fs';
import { access, mkdir, stat } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from 'pino';
import { codeOrMessage } from '../util/error-message.js';
import { makeFolder, unlessMissing } from '../util/files.js';
import { StoreUnavailableError } from './image-store.js';

/**
 * Whether the file store's folder can take images now: asked by /ready, by each reservation before any
 * work is done for its images, and after a failed write to tell why it failed.
 */
export class FolderHealth {
  private constructor(
    private readonly dir: string,
    /** The folder holding `dir`, and its device when the store opened (see check). */
    private readonly parent: string,
    private readonly parentDevice: number,
    private readonly logger: Logger,
  ) {}

  /** Makes the folder (and its missing parents), and notes the device of the folder holding it. */
  static async open(dir: string, logger: Logger): Promise<FolderHealth> {
    await makeFolder(dir);
    const parent = path.dirname(path.resolve(dir));
    return new FolderHealth(dir, parent, (await stat(parent)).dev, logger);
  }

  /**
   * Throws StoreUnavailableError when the folder cannot be written (a volume gone read-only). A folder
   * deleted under the running server is made again: its images are gone, but new ones can be kept.
   */
  async check(): Promise<void> {
    const { dir } = this;
    try {
      const folder = await unlessMissing(stat(dir));
      if (!folder) {
        // Only the folder itself, under a parent on the disk it was on: a volume that went away (its mount
        // point left empty) must not be replaced by a folder on another disk that the images then fill.
        const parent = await unlessMissing(stat(this.parent));
        if (parent?.dev !== this.parentDevice) throw Object.assign(new Error(`${dir} is gone, with the disk it was on`), { code: 'ENOENT' });
        // Requests that found it missing together each make it: made by another of them is as good.
        const made = await mkdir(dir).then(
          () => true,
          (err: NodeJS.ErrnoException) => {
            if (err.code !== 'EEXIST') throw err;
            return false;
          },
        );
        if (made) this.logger.warn({ dir }, 'the image folder was deleted while the server ran: made it again (the images it held are lost)');
      } else if (!folder.isDirectory()) {
        throw Object.assign(new Error(`${dir} is not a folder`), { code: 'ENOTDIR' });
      }
      await access(dir, constants.W_OK);
    } catch (err) {
      const { code } = err as NodeJS.ErrnoException;
      // What to do, for /ready and the log (an answer to a request gives the reason alone).
      throw new StoreUnavailableError(`the image folder ${dir} cannot be written (${codeOrMessage(err)}): make it a folder the server's user may write, or set DATA_DIR to one`, {
        cause: err,
        reason: code ?? 'unwritable',
      });
    }
  }
}
