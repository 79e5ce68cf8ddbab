import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import type { Metrics } from '../observability/metrics.js';

/**
 * GET /metrics in Prometheus' text format, behind the API key unless `public`, and the count and
 * duration of every request by route and status. Registered before auth and shutdown, whose hooks
 * reject requests: those count too.
 */

export interface MetricsOptions {
  metrics: Metrics;
  /** Scrapable without an API key. */
  public: boolean;
}

/**
 * Counts a request once its answer is done (or 499 when the client left first). Called by the hook below
 * for routed requests, and by the app for those Fastify's router refuses (frameworkErrors), for which
 * no hook runs.
 */
export function countRequest(metrics: Metrics, request: FastifyRequest, reply: FastifyReply): void {
  reply.raw.once('close', () => {
    const status = streamFailures.get(reply) ?? (reply.raw.writableFinished ? reply.statusCode : 499);
    // Route templates, never raw URLs: scanners' random paths must not become label values.
    metrics.httpRequest(request.method, request.routeOptions.url ?? 'unmatched', status, reply.elapsedTime / 1000);
  });
}

/** Streamed answers that failed after their 200 went out, and the status the failure has (see failedInStream). */
const streamFailures = new WeakMap<FastifyReply, number>();

/**
 * A streamed answer (server-sent events) that failed after its 200 went out, with an error event: it is
 * counted under the error's status, so that its failure shows where failures of other requests do.
 */
export function failedInStream(reply: FastifyReply, status: number): void {
  streamFailures.set(reply, status);
}

async function metricsPlugin(app: FastifyInstance, { metrics, public: isPublic }: MetricsOptions): Promise<void> {
  app.addHook('onRequest', async (request, reply) => countRequest(metrics, request, reply));

  app.get('/metrics', { config: { public: isPublic } }, async (_request, reply) =>
    reply.type(metrics.registry.contentType).send(await metrics.registry.metrics()),
  );
}

export const metricsRoutes = fp(metricsPlugin, { name: 'metrics' });
