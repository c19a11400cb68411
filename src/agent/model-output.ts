import { z } from 'zod';

/** One tool call as an OpenAI-compatible endpoint returns it (arguments: a JSON string). */
export const toolCallSchema = z.object({
  id: z.string().min(1).max(200),
  type: z.literal('function'),
  function: z.object({ name: z.string().max(200), arguments: z.string().max(1_000_000) }),
});
export type ToolCall = z.infer<typeof toolCallSchema>;

/** The assistant message of a chat completion, as persisted on the model stage. */
export const assistantMessageSchema = z.object({
  role: z.literal('assistant'),
  content: z.string().nullable().default(null),
  tool_calls: z.array(toolCallSchema).optional(),
});
export type AssistantMessage = z.infer<typeof assistantMessageSchema>;

/** What a model stage stores as its result: the answer, and what the planner found wrong with it. */
export interface ModelStageResult {
  message: AssistantMessage;
  /** Set when the action list was refused (a re-plan or the run's failure follows). */
  invalid?: ActionError[];
}

export interface ActionError {
  /** The tool call's id, when the model gave one. */
  callId: string | null;
  index: number | null;
  reason: 'unknown_tool' | 'arguments_not_json' | 'invalid_arguments' | 'too_many_actions';
  message: string;
}
