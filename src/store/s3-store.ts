import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { DeleteObjectsCommand, GetObjectCommand, ListObjectsV2Command, paginateListObjectsV2, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import { getSignedUrl } from '@aws-sdk/s3-request-presigner';
import { ConfigError } from '../util/config-error.js';
import { StoreUnavailableError, type ByteRange, type ImageStore, type StoredImage, type StoreLimits, type StoreReservation } from './image-store.js';
import { extensionOf, imageName, isExpired, newImage, parseImageName } from './image-names.js';
import { nameableOwner } from './image-owner.js';
import { StoreSpace } from './space.js';
import { deleteWithContentMd5 } from './s3-delete-md5.js';
import { messageOf } from '../util/error-message.js';
import { failWhenStalled } from './stalled-body.js';

/**
 * Generated images in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, Cloudflare R2, Garage), shared
 * by every replica: any replica serves an image another one made. One object per image under `prefix`,
 * named as image-names.ts says (`<id>.<expiry>[.k<owner>].<ext>`), so a listing is the whole index (each key's share of the limit too): the sweeper
 * deletes expired objects without reading them, and a restart loses nothing. Credentials, and the region
 * when S3_REGION is unset, come from the AWS SDK's standard chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,
 * AWS_PROFILE and ~/.aws files, web identity, instance roles).
 *
 * No partial object is ever visible: an S3 PUT is atomic (readers see the whole object or none), and it
 * carries Content-MD5, so the store refuses a body damaged on the way. A GET finds the object by
 * listing the id's prefix (listings are strongly consistent on the stores above) and checks the expiry
 * in its name before streaming it, so an expired image is never served even before the sweeper ran.
 *
 * The byte limit (MAX_STORE_BYTES) is the prefix's total as this replica's last listing saw it, plus its
 * own writes since; every sweep (and a put that finds the store full) lists the bucket again, so
 * replicas see each other's images within a sweep interval (docs/deploy.md).
 */

export interface S3StoreOptions extends StoreLimits {
  bucket: string;
  /** Put before every object key, e.g. `images/`; several deployments may share a bucket under different prefixes. */
  prefix: string;
  /** The S3 API's address for stores other than AWS (e.g. http://minio:9000); unset: AWS's, or AWS_ENDPOINT_URL_S3. */
  endpoint?: string;
  /** Unset: the SDK's chain (AWS_REGION, the profile's region). */
  region?: string;
  /** Address buckets as a path (http://host/bucket/key) instead of a host name: MinIO, Ceph and most self-hosted stores need it. */
  forcePathStyle: boolean;
  /** Hand out presigned GET URLs (valid until the image expires) instead of the replicas' files route. */
  presignedUrls: boolean;
  /** Longest an S3 request may go unanswered (or its connection idle) before it fails, its retries included; default 30 s. */
  requestTimeoutMs?: number;
}

/** An image as the byte limit counts it: its size, against its owner's share too (space.ts). */
type Counted = { size: number; owner?: string };

/** How long a /ready answer about the bucket holds: load balancers probe every few seconds, each replica's probe costs one LIST. */
const CHECK_CACHE_MS = 2000;
/** Longest /ready waits for the bucket: a probe is answered before the balancer gives up on it (deploy/ sets their check timeouts above it). */
export const CHECK_TIMEOUT_MS = 5000;
const REQUEST_TIMEOUT_MS = 30_000;
/** Tries of each S3 request (the SDK's default): each gets its share of the request's time limit. */
const ATTEMPTS = 3;
/** The longest a SigV4 presigned URL may live (7 days); config.ts bounds IMAGE_TTL_SECONDS by it with S3_PRESIGNED_URLS. */
const MAX_PRESIGNED_SECONDS = 604_800;
/** DeleteObjects takes at most this many keys. */
const DELETE_BATCH = 1000;

/** A client's limits on each try of a request: its time until answered, its socket's idle time (0: none), and the sockets open at once (the SDK's default: 50). */
interface BucketRequests {
  requestTimeout: number;
  socketTimeout: number;
  httpAgent?: { maxSockets: number };
  httpsAgent?: { maxSockets: number };
}

/** A client of the store's bucket, its requests limited in time (and sockets) as `requests` says. */
function bucketClient(options: S3StoreOptions, requests: BucketRequests): S3Client {
  return new S3Client({
    ...(options.endpoint && { endpoint: options.endpoint }),
    ...(options.region && { region: options.region }),
    forcePathStyle: options.forcePathStyle,
    // The SDK's default CRC32 checksums (aws-chunked uploads, trailing checksums) are refused by several
    // S3-compatible stores; Content-MD5, which every one of them checks, guards our puts instead.
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
    // The SDK retries a request that timed out, so each try gets a share of the limit (a 30 s limit per
    // try made a stalled bucket's requests fail after 90 s).
    maxAttempts: ATTEMPTS,
    requestHandler: { connectionTimeout: 5000, throwOnRequestTimeout: true, ...requests },
  });
}

export class S3ImageStore implements ImageStore {
  private readonly client: S3Client;
  /** GetObject of images' bytes as clients download them (see the constructor). */
  private readonly bodies: S3Client;
  /** Each try's time limit of a request to the bucket (its share of requestTimeoutMs). */
  private readonly tryTimeoutMs: number;
  private readonly space: StoreSpace;
  /** Images under the prefix as the last listing counted them, plus this replica's puts since. */
  private files = 0;
  /** Puts finished since the current (or last) listing began, and their images' sizes and owners: the listing may not have seen them. */
  private recent = new Map<string, Counted>();
  /** Puts in progress and their images' sizes and owners (counted in `space.used`, in no listing yet). */
  private readonly writes = new Map<Promise<unknown>, Counted>();
  private sweeping: Promise<void> | undefined;
  private checked: { at: number; result: Promise<void> } | undefined;
  private timer: NodeJS.Timeout | undefined;
  /** The bucket's clock less this machine's, as the last answer's Date header said (see bucketClock). */
  private bucketOffset = 0;
  /** When an image is judged expired (GETs, sweeps, max-age): the earlier of this machine's clock and the bucket's. */
  readonly now: () => number;
  /** When a new image's lifetime starts (its name's expiry): the later of the two. */
  private readonly madeAt: () => number;
  urlOrigin: string | undefined;

  private constructor(private readonly options: S3StoreOptions) {
    // Replicas' clocks differ, and a sweep deletes an image for every replica: one whose clock ran ahead
    // deleted others' images that much early (a URL lost before its time). The bucket's clock (its
    // answers' Date headers) is common to all, but one answer's Date may be wrong too (a gateway node or
    // a proxy's error page with a clock of its own). So an image is made at the later of the two clocks
    // and judged expired only when both say so: it dies early only if both clocks ran ahead, and may
    // outlive its time by as much as they disagree. A test's clock is its own.
    this.now = options.clock ?? (() => Math.min(Date.now(), this.bucketNow()));
    this.madeAt = options.clock ?? (() => Math.max(Date.now(), this.bucketNow()));
    this.space = new StoreSpace(options.maxBytes, () => this.sweep());
    // Each try's share of the request's limit (see maxAttempts in bucketClient).
    this.tryTimeoutMs = Math.ceil((options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS) / ATTEMPTS);
    // A bucket that takes connections and never answers (a stalled store, a half-open network) fails
    // requests after the timeout rather than holding url requests and the sweeper for as long as it
    // stays silent: without throwOnRequestTimeout the SDK only logs a warning.
    this.client = bucketClient(options, { requestTimeout: this.tryTimeoutMs, socketTimeout: this.tryTimeoutMs });
    // Images' bytes stream to clients at the clients' pace, on connections of their own. On the shared
    // pool (the SDK's 50 sockets), 50 clients downloading slowly took every socket, and the bucket's
    // lookups, puts and /ready's check waited for one: /ready answered 503 "failed to answer" for a
    // bucket that was fine, and a balancer took the replica out. Here there are as many as clients
    // downloading (MAX_CONNECTIONS bounds them), and no socket idle limit, which counts a client's
    // pauses as the bucket's silence (failWhenStalled, in read, counts the bucket's alone).
    this.bodies = bucketClient(options, { requestTimeout: this.tryTimeoutMs, socketTimeout: 0, httpAgent: { maxSockets: Infinity }, httpsAgent: { maxSockets: Infinity } });
    deleteWithContentMd5(this.client);
    if (!options.clock) this.client.middlewareStack.add((next) => async (args) => this.bucketClock(await next(args)), { step: 'deserialize', name: 'imagegenBucketClock' });
  }

  /** The bucket's time as its last answer said (this machine's until one did, and with a test's clock). */
  private bucketNow(): number {
    return Date.now() + this.bucketOffset;
  }

  /**
   * Learns the bucket's clock from an answer's Date header (every S3 answer has one): whole seconds, so
   * the bucket's time was within the second after it, taken as its middle. Replicas then agree on an
   * image's expiry to about a second, whatever their own clocks say.
   */
  private bucketClock<T extends { response: unknown }>(result: T): T {
    const date = Date.parse((result.response as { headers?: Record<string, string> }).headers?.date ?? '');
    if (Number.isFinite(date)) this.bucketOffset = date + 500 - Date.now();
    return result;
  }

  /**
   * Opens the store and counts what the prefix holds (deleting expired images). A bucket that cannot be
   * listed does not stop the server: it is logged, /ready answers 503 saying why until the bucket
   * answers, and url requests get 503 meanwhile (an orchestrator restarting replicas would not help).
   */
  static async open(options: S3StoreOptions): Promise<S3ImageStore> {
    const store = new S3ImageStore(options);
    await store.checkRegion();
    if (options.presignedUrls) store.urlOrigin = await store.presignedOrigin();
    await store.sweep().catch((err: unknown) => options.logger.error({ err }, `image store: ${messageOf(err)}; /ready answers 503 until it answers`));
    return store;
  }

  /**
   * Refuses to start without a region (S3_REGION, AWS_REGION or the profile's, read from the environment
   * and files, not the network): every request is signed for one, so each would fail ("Region is
   * missing") for as long as the server ran, a setting to fix rather than a bucket failing for a while.
   */
  private async checkRegion(): Promise<void> {
    try {
      await this.client.config.region();
    } catch {
      throw new ConfigError([
        'S3_REGION (--s3-region): STORE=s3 needs a region, and neither S3_REGION, AWS_REGION nor the AWS profile gives one: set S3_REGION to the bucket\'s (us-east-1 for MinIO and most self-hosted stores, auto for R2)',
      ]);
    }
  }

  /**
   * Where presigned URLs point: the SDK decides (path or virtual-host style, the region's endpoint), so
   * one is signed to see (locally; no request is sent). Unknown where signing fails (no credentials yet).
   */
  private async presignedOrigin(): Promise<string | undefined> {
    const probe = new GetObjectCommand({ Bucket: this.options.bucket, Key: `${this.options.prefix}origin-probe` });
    return getSignedUrl(this.client, probe, { expiresIn: 60 }).then(
      (url) => new URL(url).origin,
      (err: unknown) => {
        this.options.logger.warn({ err }, `image store: presigned URLs cannot be signed (${messageOf(err)}); the playground will not show the bucket's images`);
        return undefined;
      },
    );
  }

  private keyOf(image: StoredImage): string {
    return `${this.options.prefix}${imageName(image)}`;
  }

  /** An SDK failure as the error the service answers with a 503; the message names the bucket, the action and the store's reason. */
  private unavailable(action: string, err: unknown): StoreUnavailableError {
    const e = err as Error & { code?: string };
    // Network errors are plain Errors with a code (ECONNREFUSED); S3's own are named (NoSuchBucket, AccessDenied).
    const reason = e.name === 'Error' && e.code ? e.code : e.name;
    // HEAD answers carry no body: the SDK then says "UnknownError", which helps nobody.
    const detail = e.message && e.message !== 'UnknownError' && e.message !== reason ? `: ${e.message}` : '';
    return new StoreUnavailableError(`the S3 bucket '${this.options.bucket}' failed to ${action} (${reason}${detail})`, { cause: err, reason });
  }

  reserve(bytes: number, owner?: string): Promise<StoreReservation> {
    return this.space.reserve(bytes, nameableOwner(owner));
  }

  async put(data: Uint8Array, contentType: string, reservation?: StoreReservation): Promise<StoredImage> {
    const ext = extensionOf(contentType);
    await this.space.claim(data.byteLength, reservation);
    const image = newImage(ext, contentType, data.byteLength, this.madeAt(), this.options.ttlSeconds, reservation?.owner);
    const write = this.client.send(
      new PutObjectCommand({
        Bucket: this.options.bucket,
        Key: this.keyOf(image),
        Body: data,
        ContentType: contentType,
        ContentLength: data.byteLength,
        ContentMD5: createHash('md5').update(data).digest('base64'),
        // For presigned URLs and CDNs in front of the bucket: the image never changes and dies at its
        // expiry. No max-age, which would count the whole lifetime again from each fetch and outrank Expires.
        CacheControl: 'public, immutable',
        Expires: new Date(image.expiresAt),
      }),
    );
    const counted = { size: data.byteLength, owner: image.owner };
    this.writes.set(write, counted);
    try {
      await write;
    } catch (err) {
      this.space.free(data.byteLength, image.owner);
      throw this.unavailable('store an image', err);
    } finally {
      this.writes.delete(write);
    }
    this.recent.set(image.id, counted);
    this.files += 1;
    if (!this.options.presignedUrls) return image;
    // Signing is local (no request): the URL lives no shorter than the image (see now). The
    // bucket times it from the date it was signed at, which is on the bucket's clock too: signed at this
    // machine's time (the signer's default), a replica whose clock was behind handed out URLs that died
    // that much early (dead on arrival 10 minutes behind with a 5-minute lifetime), one ahead, too late.
    // Counted from the earlier clock it is the lifetime and the clocks' skew, which the signer refuses
    // past a week: with IMAGE_TTL_SECONDS at its most (a week) and clocks a second apart, every url
    // request got a 500. Cut to a week on the bucket's clock, the image has lived its whole lifetime
    // there, which started no earlier than the bucket's time (see madeAt), when the URL dies.
    // SigV4 counts in whole seconds: the URL lives from the second it was signed in (its date cut to the
    // second), so that cut is added, and the lifetime rounded up. Counted from now and rounded down, the
    // URL died up to two seconds before its image.
    const now = this.now();
    const signingDate = this.bucketNow();
    const expiresIn = Math.min(MAX_PRESIGNED_SECONDS, Math.max(1, Math.ceil((image.expiresAt - now + (signingDate % 1000)) / 1000)));
    const get = new GetObjectCommand({ Bucket: this.options.bucket, Key: this.keyOf(image) });
    return { ...image, url: await getSignedUrl(this.client, get, { expiresIn, signingDate: new Date(signingDate) }) };
  }

  async get(id: string): Promise<StoredImage | null> {
    const listed = await this.client
      .send(new ListObjectsV2Command({ Bucket: this.options.bucket, Prefix: `${this.options.prefix}${id}.`, MaxKeys: 2 }))
      .catch((err: unknown) => {
        throw this.unavailable('look up an image', err);
      });
    for (const object of listed.Contents ?? []) {
      const image = this.imageOf(object.Key, object.Size);
      if (image?.id === id) return isExpired(image, this.now()) ? null : image;
    }
    return null;
  }

  async read(image: StoredImage, range?: ByteRange): Promise<Readable | null> {
    if (isExpired(image, this.now())) return null;
    try {
      const { Body } = await this.bodies.send(
        new GetObjectCommand({ Bucket: this.options.bucket, Key: this.keyOf(image), ...(range && { Range: `bytes=${range.start}-${range.end}` }) }),
      );
      if (!(Body instanceof Readable)) throw new TypeError('the SDK gave no Node.js stream for the object');
      return failWhenStalled(Body, this.tryTimeoutMs, `the S3 bucket '${this.options.bucket}' stopped sending image ${image.id}`);
    } catch (err) {
      // Deleted since get(): by another replica's sweeper, or the bucket's lifecycle rule.
      if ((err as Error).name === 'NoSuchKey') return null;
      throw this.unavailable('read an image', err);
    }
  }

  /** get() has just listed the object: a HEAD costs no second request (a GetObject would start the download). */
  async has(image: StoredImage): Promise<boolean> {
    return !isExpired(image, this.now());
  }

  /** Deletes images no response will name; when the bucket fails, they stay until they expire and a sweep deletes them. */
  async remove(images: StoredImage[]): Promise<void> {
    try {
      await this.deleteKeys(images.map((image) => this.keyOf(image)));
    } catch (err) {
      this.options.logger.warn({ err }, `${messageOf(err)}: ${images.length} unused images stay until they expire`);
      return;
    }
    for (const image of images) {
      this.recent.delete(image.id);
      this.files -= 1;
      this.space.free(image.size, image.owner);
    }
  }

  /** Lists the prefix: deletes expired images and counts the rest (with this replica's puts the listing may have missed). */
  sweep(): Promise<void> {
    // Puts that find the store full sweep at once: one listing serves them all.
    this.sweeping ??= this.relist().finally(() => (this.sweeping = undefined));
    return this.sweeping;
  }

  private async relist(): Promise<void> {
    const recent = new Map<string, Counted>();
    this.recent = recent;
    /** The listing's unexpired images and their sizes and owners. */
    const seen = new Map<string, Counted>();
    const expired: string[] = [];
    try {
      for await (const page of paginateListObjectsV2({ client: this.client }, { Bucket: this.options.bucket, Prefix: this.options.prefix })) {
        for (const object of page.Contents ?? []) {
          const image = this.imageOf(object.Key, object.Size);
          if (!image) continue;
          if (isExpired(image, this.now())) expired.push(object.Key!);
          else seen.set(image.id, { size: image.size, owner: image.owner });
        }
      }
    } catch (err) {
      throw this.unavailable('list its images', err);
    }
    const missed = [...recent].filter(([id]) => !seen.has(id)).map(([, counted]) => counted);
    this.files = seen.size + missed.length;
    this.space.recount(seen.values(), missed, this.writes.values());
    // Counted before deleting, and a failed delete only logged: the limit needs what the listing found
    // unexpired, whatever becomes of the expired. Thrown, a DeleteObjects refused (a store without it, one
    // throttling) skipped the recount, so the expired images stayed counted, and the put that swept for
    // room got 503 though the listing had found it.
    try {
      await this.deleteKeys(expired);
    } catch (err) {
      this.options.logger.warn({ err }, `${messageOf(err)}: ${expired.length} expired images stay until a later sweep (or the bucket's lifecycle rule) deletes them`);
      return;
    }
    if (expired.length) this.options.logger.debug({ deleted: expired.length }, 'expired images deleted');
  }

  /** The image an object under the prefix stands for, or undefined for anything else kept there. */
  private imageOf(key: string | undefined, size: number | undefined): StoredImage | undefined {
    if (!key?.startsWith(this.options.prefix)) return undefined;
    const named = parseImageName(key.slice(this.options.prefix.length));
    return named && { ...named, size: size ?? 0 };
  }

  private async deleteKeys(keys: string[]): Promise<void> {
    for (let start = 0; start < keys.length; start += DELETE_BATCH) {
      const batch = keys.slice(start, start + DELETE_BATCH);
      const result = await this.client
        .send(new DeleteObjectsCommand({ Bucket: this.options.bucket, Delete: { Objects: batch.map((Key) => ({ Key })), Quiet: true } }))
        .catch((err: unknown) => {
          throw this.unavailable('delete images', err);
        });
      // Another replica's sweeper may have deleted some first: S3 reports no error for those.
      for (const error of result.Errors ?? []) this.options.logger.warn({ key: error.Key, code: error.Code }, `cannot delete image: ${error.Message}`);
    }
  }

  /** Throws StoreUnavailableError while the bucket cannot be listed (the permission every operation here needs too). */
  check(): Promise<void> {
    // Monotonic: on the wall clock, a step back would keep a cached answer (a failure) for as long as the step.
    const now = performance.now();
    if (!this.checked || now - this.checked.at > CHECK_CACHE_MS) {
      const result = this.client
        // A prefix no image name has (ids are hex): the answer is empty, and as cheap as a request gets.
        .send(new ListObjectsV2Command({ Bucket: this.options.bucket, Prefix: `${this.options.prefix}.probe`, MaxKeys: 1 }), {
          abortSignal: AbortSignal.timeout(Math.min(CHECK_TIMEOUT_MS, this.options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS)),
        })
        .then(
          () => undefined,
          (err: unknown) => {
            throw this.unavailable('answer', err);
          },
        );
      // Cached rejections are awaited by every caller; this keeps an unawaited one from counting as unhandled.
      result.catch(() => undefined);
      this.checked = { at: now, result };
    }
    return this.checked.result;
  }

  stats(): { files: number; bytes: number } {
    return { files: this.files, bytes: this.space.used };
  }

  /** Sweeps every `intervalMs` until close(); a failing bucket is logged (and /ready says so), the next sweep tries again. */
  startSweeper(intervalMs: number): void {
    this.timer = setInterval(() => {
      this.sweep().catch((err: unknown) => this.options.logger.warn({ err }, `image sweep failed: ${messageOf(err)}`));
    }, intervalMs);
    this.timer.unref();
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    await Promise.allSettled(this.writes.keys());
    await this.sweeping?.catch(() => undefined);
    this.client.destroy();
    this.bodies.destroy();
  }
}
