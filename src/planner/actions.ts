import type { ActionError, ToolCall } from '../agent/model-output.js';
import type { Tool } from '../definitions/types.js';

export interface PlannedAction {
  callId: string;
  tool: Tool;
  input: unknown;
}
export type ActionValidation = { ok: true; actions: PlannedAction[] } | { ok: false; errors: ActionError[] };

/**
 * The planner's check of a model's proposed action list, all of it before anything is
 * persisted (pure): at most `maxActions` calls; each names an allowed tool exactly (no case
 * folding, no trimming, no Unicode look-alikes); its arguments are a JSON object (not wrapped
 * in markdown fences, not prose); they pass the tool's zod input. The stored input is zod's
 * output, so fields the schema does not know (a "lease", a "retry") are dropped: leases,
 * timeouts and retries come only from the tool's class.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function validateActions(allowed: readonly Tool<any, any>[], calls: readonly ToolCall[], maxActions: number): ActionValidation {
  const errors: ActionError[] = [];
  if (calls.length > maxActions) {
    errors.push({
      callId: null,
      index: null,
      reason: 'too_many_actions',
      message: `${calls.length} tool calls in one answer; at most ${maxActions} are allowed`,
    });
  }
  const byName = new Map(allowed.map((t) => [t.name, t]));
  const actions: PlannedAction[] = [];
  calls.forEach((call, index) => {
    const callId = call.id;
    const tool = byName.get(call.function.name);
    if (!tool) {
      const ascii = /^[\x20-\x7e]*$/.test(call.function.name)
        ? ''
        : ' (it contains characters outside ASCII: tool names must match exactly)';
      errors.push({
        callId,
        index,
        reason: 'unknown_tool',
        message: `unknown tool "${call.function.name}"${ascii}; allowed: ${[...byName.keys()].join(', ')}`,
      });
      return;
    }
    let args: unknown;
    try {
      args = JSON.parse(call.function.arguments);
    } catch {
      const fenced = /^\s*```/.test(call.function.arguments) ? ' (do not wrap arguments in markdown fences)' : '';
      errors.push({ callId, index, reason: 'arguments_not_json', message: `arguments of ${tool.name} are not valid JSON${fenced}` });
      return;
    }
    if (args === null || typeof args !== 'object' || Array.isArray(args)) {
      errors.push({ callId, index, reason: 'arguments_not_json', message: `arguments of ${tool.name} must be a JSON object` });
      return;
    }
    const parsed = tool.input.safeParse(args);
    if (!parsed.success) {
      const detail = parsed.error.issues.map((i) => `${i.path.join('.') || '$'}: ${i.message}`).join('; ');
      errors.push({ callId, index, reason: 'invalid_arguments', message: `arguments of ${tool.name} are invalid: ${detail}` });
      return;
    }
    actions.push({ callId, tool: tool as Tool, input: parsed.data });
  });
  return errors.length > 0 ? { ok: false, errors } : { ok: true, actions };
}
