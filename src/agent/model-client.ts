import OpenAI from 'openai';
import type { ModelSpec, Tool } from '../definitions/types.js';
import { toolJsonSchema } from '../definitions/json-schema.js';
import { PermanentError, TransientError } from '../errors.js';
import { toJsonText } from '../store/json.js';
import { noteUsage } from '../observability/model-usage.js';
import type { ChatMessage } from './messages.js';
import { assistantMessageSchema, type AssistantMessage } from './model-output.js';

const clients = new Map<string, OpenAI>();

function clientFor(spec: ModelSpec): OpenAI {
  const baseURL = spec.baseURL ?? process.env.OPENAI_BASE_URL ?? undefined;
  const apiKey = spec.apiKey ?? process.env.OPENAI_API_KEY ?? 'not-needed';
  const key = `${baseURL ?? ''}\u0000${apiKey}`;
  let c = clients.get(key);
  if (!c) {
    // Retries belong to the model stage's class (one attempt = one request): none here.
    c = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
    clients.set(key, c);
  }
  return c;
}

/** The tools offered to the model: JSON Schema generated from each tool's zod input. */
export function toolsForModel(tools: readonly Tool[]): OpenAI.Chat.Completions.ChatCompletionTool[] {
  return tools.map((t) => ({
    type: 'function',
    function: { name: t.name, description: t.description, parameters: toolJsonSchema(t) as Record<string, unknown> },
  }));
}

/**
 * One chat-completions call through the official `openai` client against any
 * OpenAI-compatible endpoint. Its answer is validated with zod, then checked like a tool's
 * output: an answer the database cannot store (a U+0000 in its text, say) is a permanent
 * `invalid_model_output`, never asked again until the budget is spent. A 4xx that will not
 * change (bad request, auth) is permanent; 408, 409, 429, 5xx and network errors are transient.
 */
export async function callModel(
  spec: ModelSpec,
  messages: ChatMessage[],
  tools: readonly Tool[],
  signal: AbortSignal,
  timeoutMs: number,
): Promise<AssistantMessage> {
  let completion: OpenAI.Chat.Completions.ChatCompletion;
  try {
    completion = await clientFor(spec).chat.completions.create(
      {
        model: spec.name,
        messages: messages as OpenAI.Chat.Completions.ChatCompletionMessageParam[],
        tools: toolsForModel(tools),
        ...(spec.temperature !== null ? { temperature: spec.temperature } : {}),
      },
      { signal, timeout: timeoutMs },
    );
  } catch (err) {
    if (signal.aborted) throw signal.reason;
    if (err instanceof OpenAI.APIError && err.status !== undefined) {
      const transient = err.status === 408 || err.status === 409 || err.status === 429 || err.status >= 500;
      const Err = transient ? TransientError : PermanentError;
      throw new Err(`model endpoint answered ${err.status}: ${err.message}`, { code: `model_http_${err.status}`, cause: err });
    }
    throw new TransientError(`model endpoint unreachable: ${(err as Error).message}`, { code: 'model_unreachable', cause: err });
  }
  const choice = completion.choices?.[0];
  const parsed = assistantMessageSchema.safeParse(choice?.message);
  if (!parsed.success) {
    throw new TransientError(
      `the model's answer is not a chat message: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`,
      { code: 'model_answer_malformed' },
    );
  }
  try {
    toJsonText(parsed.data, 'answer');
  } catch (err) {
    throw new PermanentError(`the model's answer cannot be stored: ${(err as Error).message}`, { code: 'invalid_model_output' });
  }
  noteUsage(parsed.data, completion.usage);
  return parsed.data;
}
