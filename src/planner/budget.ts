import type { AgentBudget } from '../definitions/types.js';

/** What a run's model calls have used so far (summed from its model stages' events). */
export interface BudgetSpent {
  inputTokens: number;
  outputTokens: number;
  /** Null when no model stage had a price. */
  cost: number | null;
}

export type BudgetVerdict =
  | { ok: true }
  | { ok: false; code: 'budget_exceeded'; reason: 'max_tokens' | 'max_cost'; limit: number; spent: number; message: string };

/**
 * Pure: may the run make its next model call? Asked once per model call, before it, with the
 * usage of every model stage of the run that finished (their events). A run that has REACHED a
 * limit (used >= limit) makes no further call; one below it makes the call, whatever that call
 * then uses — a call is never cut in the middle, so a run may pass its budget by at most its
 * last call, and then makes no more. Tokens count input + output. A cost limit with no cost
 * recorded (no priced call yet) is not reached.
 */
export function budgetBeforeModelCall(budget: AgentBudget | null, spent: BudgetSpent): BudgetVerdict {
  if (!budget) return { ok: true };
  const tokens = spent.inputTokens + spent.outputTokens;
  if (budget.maxTokens !== null && tokens >= budget.maxTokens) {
    return {
      ok: false,
      code: 'budget_exceeded',
      reason: 'max_tokens',
      limit: budget.maxTokens,
      spent: tokens,
      message: `the run used ${tokens} model tokens, its budget is ${budget.maxTokens}: no further model call`,
    };
  }
  if (budget.maxCost !== null && spent.cost !== null && spent.cost >= budget.maxCost) {
    return {
      ok: false,
      code: 'budget_exceeded',
      reason: 'max_cost',
      limit: budget.maxCost,
      spent: spent.cost,
      message: `the run's model calls cost ${spent.cost}, its budget is ${budget.maxCost}: no further model call`,
    };
  }
  return { ok: true };
}
