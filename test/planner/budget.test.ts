import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass } from '../../src/definitions/index.js';
import { costOf } from '../../src/observability/model-usage.js';
import { budgetBeforeModelCall } from '../../src/planner/budget.js';

const spent = (inputTokens: number, outputTokens: number, cost: number | null = null) => ({ inputTokens, outputTokens, cost });

describe('budgetBeforeModelCall (pure)', () => {
  it('no budget: always a call', () => {
    expect(budgetBeforeModelCall(null, spent(1e9, 1e9, 1e9))).toEqual({ ok: true });
  });
  it('tokens: in + out below the limit may call; reaching it exactly stops; passing it stops', () => {
    const b = { maxTokens: 200, maxCost: null };
    expect(budgetBeforeModelCall(b, spent(0, 0)).ok).toBe(true);
    expect(budgetBeforeModelCall(b, spent(150, 49)).ok).toBe(true);
    const at = budgetBeforeModelCall(b, spent(150, 50));
    expect(at).toMatchObject({ ok: false, code: 'budget_exceeded', reason: 'max_tokens', limit: 200, spent: 200 });
    expect(budgetBeforeModelCall(b, spent(240, 0))).toMatchObject({ ok: false, reason: 'max_tokens', spent: 240 });
  });
  it('cost: reached stops; no priced call yet is not reached', () => {
    const b = { maxTokens: null, maxCost: 0.001 };
    expect(budgetBeforeModelCall(b, spent(1e6, 1e6, null)).ok).toBe(true);
    expect(budgetBeforeModelCall(b, spent(0, 0, 0.000999)).ok).toBe(true);
    expect(budgetBeforeModelCall(b, spent(0, 0, 0.001))).toMatchObject({ ok: false, reason: 'max_cost', limit: 0.001 });
  });
  it('both limits: tokens are checked first, either one stops', () => {
    const b = { maxTokens: 100, maxCost: 1 };
    expect(budgetBeforeModelCall(b, spent(100, 0, 2))).toMatchObject({ ok: false, reason: 'max_tokens' });
    expect(budgetBeforeModelCall(b, spent(10, 0, 2))).toMatchObject({ ok: false, reason: 'max_cost' });
  });
});

describe('costOf', () => {
  it('per million tokens in and out, exact to 1e-9', () => {
    expect(costOf({ inputPerMillion: 2, outputPerMillion: 10 }, { inputTokens: 100, outputTokens: 20 })).toBe(0.0004);
    expect(costOf({ inputPerMillion: 0.15, outputPerMillion: 0.6 }, { inputTokens: 1_000_000, outputTokens: 500_000 })).toBe(0.45);
    expect(costOf({ inputPerMillion: 0, outputPerMillion: 0 }, { inputTokens: 5, outputTokens: 5 })).toBe(0);
  });
});

describe('agent budget and pricing definitions', () => {
  const cls = defineToolClass({ name: 'b-llm', lease: '5s', heartbeat: '1s', jitter: '200ms', timeout: '4s', maxDuration: '30s' });
  const tool = defineTool({
    name: 't',
    description: 't',
    class: cls,
    input: z.object({}),
    output: z.object({}),
    run: async () => ({}),
  });
  const base = { name: 'b', input: z.object({}), instructions: 'x', tools: [tool] };
  it('maxCost without pricing is an invalid definition', () => {
    expect(() => defineAgent({ ...base, model: { name: 'm', class: cls }, budget: { maxCost: 1 } })).toThrow(
      /budget.maxCost needs model.pricing/,
    );
  });
  it('an empty budget, a negative price are refused', () => {
    expect(() => defineAgent({ ...base, model: { name: 'm', class: cls }, budget: {} })).toThrow(/invalid_definition|maxTokens, maxCost/);
    expect(() =>
      defineAgent({ ...base, model: { name: 'm', class: cls, pricing: { inputPerMillion: -1, outputPerMillion: 1 } } }),
    ).toThrow();
  });
  it('budget and pricing change the hash only when set; stream never does', () => {
    const plain = defineAgent({ ...base, model: { name: 'm', class: cls } });
    const streamed = defineAgent({ ...base, model: { name: 'm', class: cls, stream: true } });
    const budgeted = defineAgent({ ...base, model: { name: 'm', class: cls }, budget: { maxTokens: 10 } });
    const priced = defineAgent({ ...base, model: { name: 'm', class: cls, pricing: { inputPerMillion: 1, outputPerMillion: 2 } } });
    expect(streamed.hash).toBe(plain.hash);
    expect(new Set([plain.hash, budgeted.hash, priced.hash]).size).toBe(3);
    expect(budgeted.agent?.budget).toEqual({ maxTokens: 10, maxCost: null });
  });
});
