import { refusalAnswer } from '../planner/waits.js';
import type { AgentSpec } from '../definitions/types.js';
import type { RunStageRow } from '../store/index.js';
import { MODEL_STAGE_TOOL } from '../definitions/agent.js';
import type { ModelStageResult } from './model-output.js';

export type ChatMessage =
  | { role: 'system' | 'user'; content: string }
  | { role: 'assistant'; content: string | null; tool_calls?: ModelStageResult['message']['tool_calls'] }
  | { role: 'tool'; tool_call_id: string; content: string };

/**
 * The conversation a model stage sends, rebuilt from what the database holds (so a model stage
 * resumed after a crash sends the same conversation): instructions, the run's input, then each
 * earlier model answer followed by its tools' results — or, for a refused action list, the
 * planner's errors as tool errors.
 */
export function buildMessages(agent: AgentSpec, runInput: unknown, stages: readonly RunStageRow[], uptoSeq: number): ChatMessage[] {
  const messages: ChatMessage[] = [
    { role: 'system', content: agent.instructions },
    { role: 'user', content: typeof runInput === 'string' ? runInput : JSON.stringify(runInput) },
  ];
  for (const s of stages) {
    if (s.seq >= uptoSeq) break;
    if (s.tool === MODEL_STAGE_TOOL) {
      const r = s.result as ModelStageResult | null;
      if (!r) continue;
      messages.push({
        role: 'assistant',
        content: r.message.content ?? null,
        ...(r.message.tool_calls?.length ? { tool_calls: r.message.tool_calls } : {}),
      });
      if (r.invalid) {
        const calls = r.message.tool_calls ?? [];
        for (const call of calls) {
          const mine = r.invalid.filter((e) => e.callId === call.id || e.callId === null).map((e) => e.message);
          messages.push({
            role: 'tool',
            tool_call_id: call.id,
            content: JSON.stringify({
              error: 'invalid_action',
              details: mine.length ? mine : ['not run: another action in the list was invalid'],
            }),
          });
        }
        if (calls.length === 0)
          messages.push({ role: 'user', content: `Your answer was refused: ${r.invalid.map((e) => e.message).join('; ')}` });
      }
    } else {
      messages.push({ role: 'tool', tool_call_id: s.name, content: toolAnswer(s) });
    }
  }
  return messages;
}

/**
 * What the model hears of one tool call: its result; or, for a call that failed for good (the
 * agent tells tool errors to the model), the error's code and message, never a stack.
 */
export function toolAnswer(stage: Pick<RunStageRow, 'state' | 'result' | 'error'>): string {
  if (stage.state !== 'failed') return JSON.stringify(stage.result ?? null);
  // A call a person rejected (or nobody approved in time) is a decision, not a tool failure (issue 10).
  const refused = refusalAnswer((stage.error ?? {}) as { code?: unknown; details?: unknown });
  if (refused) return JSON.stringify(refused);
  const e = (stage.error ?? {}) as { code?: unknown; message?: unknown; lastError?: { code?: unknown; message?: unknown } };
  const last = e.lastError ?? e;
  return JSON.stringify({
    error: 'tool_failed',
    code: typeof last.code === 'string' ? last.code : 'unknown',
    message: typeof last.message === 'string' ? last.message : 'the tool failed',
  });
}
