import type { FastifyInstance } from 'fastify';
import type { EnginePool, Readiness } from '../engine/pool.js';
import { ApiError } from '../api/errors.js';

/**
 * Probes for load balancers and orchestrators, no key needed, answered while workers are busy.
 * /health: the process is alive. /ready: it can generate now, i.e. every worker is up and has loaded
 * the models to preload; until then 503 with Retry-After, so traffic goes elsewhere meanwhile.
 */

export interface HealthOptions {
  engine: EnginePool;
}

/** Seconds a probe should wait before asking again: loading a model takes a few. */
const RETRY_AFTER_SECONDS = 5;

function notReady({ workers, models }: Readiness): ApiError {
  const failed = models.find((m) => m.error);
  const loading = models.filter((m) => m.loadedOn < workers.total).map((m) => `'${m.model}'`);
  const why = failed
    ? `model '${failed.model}' failed to load: ${failed.error}`
    : `${workers.ready} of ${workers.total} workers are ready${loading.length ? `, loading ${loading.join(', ')}` : ''}`;
  return new ApiError(503, `The server is starting and cannot generate yet: ${why}.`, {
    code: 'not_ready',
    headers: { 'retry-after': String(RETRY_AFTER_SECONDS) },
  });
}

export async function health(app: FastifyInstance, { engine }: HealthOptions): Promise<void> {
  app.get('/health', { config: { public: true } }, async () => ({ status: 'ok', queue: engine.load() }));

  app.get('/ready', { config: { public: true } }, async () => {
    const readiness = engine.readiness();
    if (!readiness.ready) throw notReady(readiness);
    return { status: 'ready', workers: readiness.workers, models: readiness.models };
  });
}
