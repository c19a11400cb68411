import { Counter, type Registry } from 'prom-client';
import type { ModelPricing, ModelSpec } from '../definitions/types.js';

/**
 * Model usage (tokens in and out, from the provider's `usage`), recorded per model stage: in the
 * finish event of the attempt that got the answer (data.usage, with `cost` when the model has `pricing`;
 * stage_succeeded, or stage_failed / retry_scheduled when the stage failed after the answer), summed
 * per run by GET /v1/runs/:id, and counted in Prometheus by model and workflow
 * (ratchet_model_tokens_total, ratchet_model_cost_total). A provider that sends no usage counts nothing.
 */
export interface ModelUsage {
  inputTokens: number;
  outputTokens: number;
  /** inputTokens × inputPerMillion / 1e6 + outputTokens × outputPerMillion / 1e6, when the model has a price. */
  cost?: number;
}

const usageOfAnswer = new WeakMap<object, ModelUsage>();

/** The model client notes an answer's usage here (the answer itself is persisted without it). */
export function noteUsage(answer: object, usage: { prompt_tokens?: unknown; completion_tokens?: unknown } | null | undefined): void {
  if (!usage) return;
  const n = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? Math.round(v) : 0);
  usageOfAnswer.set(answer, { inputTokens: n(usage.prompt_tokens), outputTokens: n(usage.completion_tokens) });
}

/** A call's cost under `pricing` (per million tokens), rounded to 1e-9 so sums stay exact in numeric. */
export function costOf(pricing: ModelPricing, usage: { inputTokens: number; outputTokens: number }): number {
  const raw = (usage.inputTokens * pricing.inputPerMillion + usage.outputTokens * pricing.outputPerMillion) / 1e6;
  return Math.round(raw * 1e9) / 1e9;
}

/** An answer's usage (with its cost under `pricing`), or null when the provider sent none. */
export function usageOf(answer: object, pricing: ModelPricing | null): ModelUsage | null {
  const u = usageOfAnswer.get(answer);
  if (!u) return null;
  return pricing ? { ...u, cost: costOf(pricing, u) } : u;
}

type Labels = 'model' | 'workflow' | 'direction';
const counters = new WeakMap<Registry, { tokens: Counter<Labels>; cost: Counter<'model' | 'workflow'> }>();
function countersOf(registry: Registry) {
  let c = counters.get(registry);
  if (!c) {
    const tokens =
      (registry.getSingleMetric('ratchet_model_tokens_total') as Counter<Labels> | undefined) ??
      new Counter({
        name: 'ratchet_model_tokens_total',
        help: 'model tokens used by model stages that finished, by model, workflow and direction (input / output)',
        labelNames: ['model', 'workflow', 'direction'],
        registers: [registry],
      });
    const cost =
      (registry.getSingleMetric('ratchet_model_cost_total') as Counter<'model' | 'workflow'> | undefined) ??
      new Counter({
        name: 'ratchet_model_cost_total',
        help: "cost of model stages that finished (the model's pricing per million tokens applied to their usage), by model and workflow",
        labelNames: ['model', 'workflow'],
        registers: [registry],
      });
    c = { tokens, cost };
    counters.set(registry, c);
  }
  return c;
}

/** The event data for a model stage's answer (`{ usage }`, with its cost when priced), counted in `registry`; {} when the provider sent none. */
export function recordModelUsage(
  registry: Registry,
  model: Pick<ModelSpec, 'name' | 'pricing'>,
  workflow: string,
  answer: object,
): { usage?: ModelUsage } {
  const u = usageOfAnswer.get(answer);
  if (!u) return {};
  const c = countersOf(registry);
  c.tokens.inc({ model: model.name, workflow, direction: 'input' }, u.inputTokens);
  c.tokens.inc({ model: model.name, workflow, direction: 'output' }, u.outputTokens);
  if (!model.pricing) return { usage: u };
  const cost = costOf(model.pricing, u);
  c.cost.inc({ model: model.name, workflow }, cost);
  return { usage: { ...u, cost } };
}
