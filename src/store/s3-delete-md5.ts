import { createHash } from 'node:crypto';
import type { S3Client } from '@aws-sdk/client-s3';

/**
 * DeleteObjects with Content-MD5, as every S3-compatible store takes it. S3 requires an integrity header
 * on it, and the SDK (since 3.729) sends a CRC32 one there even with requestChecksumCalculation
 * WHEN_REQUIRED, which stores that only know Content-MD5 refuse (older MinIO releases, Oracle Object
 * Storage: 400 MissingContentMD5). Refused, no sweep got past deleting the expired images: they stayed,
 * stayed counted against MAX_STORE_BYTES, and once the count reached it every url request got 503. This
 * is the fallback the SDK's own guide gives (supplemental-docs/MD5_FALLBACK.md); AWS takes either header.
 */
export function deleteWithContentMd5(client: S3Client): void {
  client.middlewareStack.add(
    (next, context) => async (args) => {
      const request = args.request as { headers?: Record<string, string>; body?: unknown };
      const { headers, body } = request;
      if (context.commandName !== 'DeleteObjectsCommand' || !headers || !(typeof body === 'string' || body instanceof Uint8Array)) return next(args);
      // Only the one header: the stores that want Content-MD5 may refuse the flexible checksum's headers too.
      for (const name of Object.keys(headers)) if (/^x-amz-(sdk-)?checksum-/i.test(name)) delete headers[name];
      headers['content-md5'] = createHash('md5').update(body).digest('base64');
      return next(args);
    },
    // After the SDK's checksum middleware (the same step, at normal priority), before signing.
    { step: 'build', priority: 'low', name: 'imagegenDeleteObjectsContentMd5' },
  );
}
