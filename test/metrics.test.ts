import { describe, expect, it } from 'vitest';
import { Metrics } from '../src/observability/metrics.js';

/** The value of one sample line of Prometheus text, by its name and labels as written. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

describe('duration histograms', () => {
  it('tell apart the long runs of real models on a CPU: a 15-minute batch and a 12-minute load fall in finite buckets', async () => {
    const metrics = new Metrics();
    metrics.batchFinished({ model: 'sdxl', images: 4, steps: 30, seconds: 900, outcome: 'completed' });
    metrics.modelLoaded('flux', 700);
    const text = await metrics.registry.metrics();
    const generation = (le: string) => sample(text, `imagegen_generation_duration_seconds_bucket{le="${le}",model="sdxl",outcome="completed"}`);
    expect([generation('600'), generation('1800'), generation('+Inf')]).toEqual([0, 1, 1]);
    const load = (le: string) => sample(text, `imagegen_model_load_duration_seconds_bucket{le="${le}",model="flux"}`);
    expect([load('300'), load('1800')]).toEqual([0, 1]);
  });
});
