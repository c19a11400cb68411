import { BudgetExceededError } from '../errors.js';
import type { AgentSpec } from '../definitions/types.js';
import { budgetBeforeModelCall } from '../planner/budget.js';
import type { RunUsage } from '../store/usage.js';

/**
 * The executor's hook before a model call: throws BudgetExceededError (permanent, code
 * budget_exceeded: the model stage and the run fail) when the run reached its agent's budget,
 * from its usage so far (`spent`, read from the store). Agents without a budget never read it.
 */
export function assertWithinBudget(agent: AgentSpec, spent: RunUsage | null): void {
  if (!agent.budget || !spent) return;
  const v = budgetBeforeModelCall(agent.budget, { ...spent, cost: spent.cost ?? null });
  if (!v.ok) throw new BudgetExceededError(v.message, { reason: v.reason, limit: v.limit, spent: v.spent });
}
