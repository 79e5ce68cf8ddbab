import type { ServerResponse } from 'node:http';
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
 * The route label of requests refused before any route could take them: by Node's HTTP parser (malformed,
 * headers too large, too slow to arrive), as CONNECT, or by Fastify's router (a malformed URL). Not
 * `unmatched`, the label of URLs no route takes, which a scanner's probing fills.
 */
export const BEFORE_ROUTING = 'before_routing';

/**
 * Counts a request once its answer is done, under the status the client got: the reply's, the one
 * answeredAside recorded where that is not it, or 499 when the client left first. Called by the hook below
 * for routed requests, and by the app for those Fastify's router refuses (frameworkErrors, `route`
 * BEFORE_ROUTING), for which no hook runs.
 */
export function countRequest(metrics: Metrics, request: FastifyRequest, reply: FastifyReply, route = request.routeOptions.url ?? 'unmatched'): void {
  reply.raw.once('close', () => {
    const status = answeredStatus(reply.raw) ?? (reply.raw.writableFinished ? reply.statusCode : 499);
    // Route templates, never raw URLs: scanners' random paths must not become label values.
    metrics.httpRequest(request.method, route, status, reply.elapsedTime / 1000);
  });
}

/** Answers whose status is not the reply's own (see answeredAside). */
const asideStatuses = new WeakMap<ServerResponse, number>();

/**
 * An answer whose status is not the one its reply sent, so that it is counted (and logged) as what the
 * client got: a streamed answer (server-sent events) that failed after its 200 went out, with an error
 * event, under the error's status; and a 408 written to the socket by hand (errors.ts) for a request
 * whose body did not arrive in time, which would otherwise count as a client that left (499).
 */
export function answeredAside(response: ServerResponse, status: number): void {
  asideStatuses.set(response, status);
}

/** The status answeredAside recorded for a response, if any. */
export const answeredStatus = (response: ServerResponse): number | undefined => asideStatuses.get(response);

async function metricsPlugin(app: FastifyInstance, { metrics, public: isPublic }: MetricsOptions): Promise<void> {
  app.addHook('onRequest', async (request, reply) => countRequest(metrics, request, reply));

  // Scraped every 15 s or so: its request lines at debug level (logging.ts).
  app.get('/metrics', { config: { public: isPublic, polled: true } }, async (_request, reply) =>
    reply.type(metrics.registry.contentType).send(await metrics.registry.metrics()),
  );
}

export const metricsRoutes = fp(metricsPlugin, { name: 'metrics' });
