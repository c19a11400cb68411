import { Counter, type Registry } from 'prom-client';

/**
 * Model usage (tokens in and out, from the provider's `usage`), recorded per model stage: in the
 * stage's `stage_succeeded` event (data.usage), summed per run by GET /v1/runs/:id, and
 * counted in Prometheus by model and workflow. A provider that sends no usage counts nothing.
 */
export interface ModelUsage {
  inputTokens: number;
  outputTokens: number;
}

const usageOfAnswer = new WeakMap<object, ModelUsage>();

/** The model client notes an answer's usage here (the answer itself is persisted without it). */
export function noteUsage(answer: object, usage: { prompt_tokens?: unknown; completion_tokens?: unknown } | null | undefined): void {
  if (!usage) return;
  const n = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? Math.round(v) : 0);
  usageOfAnswer.set(answer, { inputTokens: n(usage.prompt_tokens), outputTokens: n(usage.completion_tokens) });
}

const counters = new WeakMap<Registry, Counter<'model' | 'workflow' | 'direction'>>();
function tokenCounter(registry: Registry): Counter<'model' | 'workflow' | 'direction'> {
  let c = counters.get(registry);
  if (!c) {
    const existing = registry.getSingleMetric('ratchet_model_tokens_total') as Counter<'model' | 'workflow' | 'direction'> | undefined;
    c =
      existing ??
      new Counter({
        name: 'ratchet_model_tokens_total',
        help: 'model tokens used by model stages that finished, by model, workflow and direction (input / output)',
        labelNames: ['model', 'workflow', 'direction'],
        registers: [registry],
      });
    counters.set(registry, c);
  }
  return c;
}

/** The event data for a model stage's answer (`{ usage }`), counted in `registry`; {} when the provider sent none. */
export function recordModelUsage(registry: Registry, model: string, workflow: string, answer: object): { usage?: ModelUsage } {
  const u = usageOfAnswer.get(answer);
  if (!u) return {};
  const c = tokenCounter(registry);
  c.inc({ model, workflow, direction: 'input' }, u.inputTokens);
  c.inc({ model, workflow, direction: 'output' }, u.outputTokens);
  return { usage: u };
}
