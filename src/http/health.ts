import type { FastifyInstance } from 'fastify';
import type { Readiness } from '../engine/worker-slots.js';
import { ApiError } from '../api/errors.js';
import type { ModelRegistry } from '../models/registry.js';
import type { ImageStore } from '../store/image-store.js';
import { sendError } from './errors.js';
import { isLocallyAddressed } from './local-only.js';
import { messageOf } from '../util/error-message.js';

/**
 * Probes for load balancers and orchestrators, no key needed, answered while workers are busy.
 * /health: the process is alive. /ready: it can generate now, i.e. every worker is up and has loaded
 * the models to preload (once that was so, one such worker is enough: others crashing and restarting
 * slow the server but do not stop it), and the image store can be used (a bucket that cannot be reached says so);
 * until then 503 with Retry-After, so traffic goes elsewhere meanwhile. A ready
 * server also lists the model folders it skips, with the reason the log and `imagegen models list` give:
 * an operator who installed a model that never appears finds out why from the probe.
 *
 * Probes come every few seconds, so their request lines go out at debug level (`polled`: logging.ts) and a
 * 503 from /ready is no error with a stack trace: the log gets one line when readiness changes, saying why.
 *
 * /ready needs no key, so the reasons (a bucket's name and address, model folders and their errors) go
 * only to peers on this machine (request.ip: behind a TRUST_PROXY proxy, the client's) that address it
 * as localhost, 127.0.0.1 or [::1] and are no page of another site (isLocallyAddressed); a balancer
 * elsewhere needs only the status, and its answers point to the log.
 */

/** What /health and /ready use of the engine (engine/pool.ts's pool, a test's stand-in). */
export interface HealthEngine {
  /** Jobs running and waiting. */
  load(): { running: number; queued: number };
  /** Whether the workers are ready, and the models they preload. */
  readiness(): Readiness;
}

export interface HealthOptions {
  engine: HealthEngine;
  /** Where /ready learns the skipped model folders; without it /ready lists none. */
  registry?: Pick<ModelRegistry, 'unusable'>;
  /** Whose check() /ready asks; without it the store is taken to work. */
  store?: Pick<ImageStore, 'check'>;
}

/** Seconds a probe should wait before asking again: loading a model takes a few. */
const RETRY_AFTER_SECONDS = 5;

/** What a not-ready server cannot do, before the reasons: a server past starting lost its workers. */
const cannot = (started: boolean) => (started ? 'The server cannot generate right now' : 'The server is starting and cannot generate yet');

function notReady({ workers, models, startFailure, started }: Readiness): ApiError {
  const failed = models.find((m) => m.error);
  const loading = models.filter((m) => m.loadedOn < workers.total).map((m) => `'${m.model}'`);
  const why = failed
    ? `model '${failed.model}' failed to load: ${failed.error}`
    : `${workers.ready} of ${workers.total} workers are ready${loading.length ? `, loading ${loading.join(', ')}` : ''}${startFailure ? `; ${startFailure}` : ''}`;
  return new ApiError(503, `${cannot(started)}: ${why}.`, {
    code: 'not_ready',
    headers: { 'retry-after': String(RETRY_AFTER_SECONDS) },
  });
}

/** The skipped folders as /ready lists them, or nothing when there are none (the body then has no `unusable`). */
function unusableModels(registry: HealthOptions['registry']): { unusable?: { model: string; reason: string }[] } {
  const unusable = registry?.unusable().map(({ id, reason }) => ({ model: id, reason })) ?? [];
  return unusable.length ? { unusable } : {};
}

const PROBE = { config: { public: true, polled: true } } as const;

/** The store's reason not to be ready, or undefined when it works. */
async function storeProblem(store: HealthOptions['store']): Promise<ApiError | undefined> {
  // What it rejected with need be no Error (a thrown undefined read as a working store).
  const failure = await store?.check().then(
    () => undefined,
    (err: unknown) => ({ reason: messageOf(err) }),
  );
  return (
    failure &&
    new ApiError(503, `The image store cannot be used: ${failure.reason}.`, {
      code: 'storage_unavailable',
      headers: { 'retry-after': String(RETRY_AFTER_SECONDS) },
    })
  );
}

/** What a peer elsewhere is told instead of `error`'s reasons: the same status, code and headers. */
function withoutReasons(error: ApiError): ApiError {
  const what = error.code === 'storage_unavailable' ? 'The image store cannot be used' : error.message.slice(0, error.message.indexOf(':'));
  return new ApiError(error.status, `${what}; the server's log says why (as does /ready asked from the server's own machine at localhost).`, { code: error.code, headers: error.headers });
}

export async function health(app: FastifyInstance, { engine, registry, store }: HealthOptions): Promise<void> {
  /** What /ready last said: 'ready' or the not-ready message. */
  let lastState: string | undefined;
  const logChange = (state: string) => {
    if (state === lastState) return;
    lastState = state;
    if (state === 'ready') app.log.info('ready: /ready answers 200');
    else app.log.warn(`not ready: /ready answers 503: ${state}`);
  };

  app.get('/health', PROBE, async () => ({ status: 'ok', queue: engine.load() }));

  app.get('/ready', PROBE, async (request, reply) => {
    const local = isLocallyAddressed(request);
    const readiness = engine.readiness();
    const error = readiness.ready ? await storeProblem(store) : notReady(readiness);
    if (error) {
      logChange(error.message);
      return sendError(reply, local ? error : withoutReasons(error));
    }
    logChange('ready');
    return { status: 'ready', workers: readiness.workers, models: readiness.models, ...(local && unusableModels(registry)) };
  });
}
