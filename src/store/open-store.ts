import { FileImageStore } from './file-store.js';
import type { ImageStore, StoreLimits } from './image-store.js';
import type { S3StoreOptions } from './s3-store.js';

/** STORE's choices: where generated images live (the settings of each are in src/config.ts). */

export interface StoreChoice {
  /** `fs`: a folder of this machine (one replica); `s3`: an S3-compatible bucket that replicas share. */
  kind: 'fs' | 's3';
  /** The folder of the `fs` store. */
  dir: string;
  /** The `s3` store's bucket and how to reach it. */
  s3: Pick<S3StoreOptions, 'endpoint' | 'region' | 'forcePathStyle' | 'presignedUrls' | 'prefix'> & { bucket?: string };
}

export interface SweptStore extends ImageStore {
  /** Deletes expired images every `intervalMs` until close(). */
  startSweeper(intervalMs: number): void;
}

const OPENERS: Record<StoreChoice['kind'], (choice: StoreChoice, limits: StoreLimits) => Promise<SweptStore>> = {
  fs: ({ dir }, limits) => FileImageStore.open({ dir, ...limits }),
  s3: async ({ s3 }, limits) => {
    if (!s3.bucket) throw new Error('STORE=s3 needs S3_BUCKET');
    // Loaded only when chosen: the AWS SDK is large, and a single server has no use for it.
    const { S3ImageStore } = await import('./s3-store.js');
    return S3ImageStore.open({ ...s3, bucket: s3.bucket, ...limits });
  },
};

/** Opens the chosen store. */
export function openImageStore(choice: StoreChoice, limits: StoreLimits): Promise<SweptStore> {
  return OPENERS[choice.kind](choice, limits);
}
