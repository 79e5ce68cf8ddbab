import type { FastifyInstance } from 'fastify';
import type { EnginePool } from '../engine/pool.js';

/** Liveness for load balancers and orchestrators: no key needed, answered while workers are busy. */

export interface HealthOptions {
  engine: EnginePool;
}

export async function health(app: FastifyInstance, { engine }: HealthOptions): Promise<void> {
  app.get('/health', { config: { public: true } }, async () => ({ status: 'ok', queue: engine.load() }));
}
