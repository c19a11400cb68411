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
  /** With it, the answer is asked as a stream and each piece of its text is passed here as it arrives. */
  onDelta?: (text: string) => void,
): Promise<AssistantMessage> {
  let completion: Pick<OpenAI.Chat.Completions.ChatCompletion, 'choices' | 'usage'>;
  const body = {
    model: spec.name,
    messages: messages as OpenAI.Chat.Completions.ChatCompletionMessageParam[],
    tools: toolsForModel(tools),
    ...(spec.temperature !== null ? { temperature: spec.temperature } : {}),
  };
  try {
    completion = onDelta
      ? await streamed(spec, body, signal, timeoutMs, onDelta)
      : await clientFor(spec).chat.completions.create(body, { signal, timeout: timeoutMs });
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

type ChunkToolCall = { id?: string; type?: string; function?: { name?: string; arguments?: string } };

/**
 * The streaming form of the same call (`stream: true`, usage asked in the last chunk): text
 * pieces go to `onDelta` as they arrive, and the chunks are put back together into the one
 * answer that is validated and persisted — the watchers' pieces are never stored.
 */
async function streamed(
  spec: ModelSpec,
  body: OpenAI.Chat.Completions.ChatCompletionCreateParamsNonStreaming,
  signal: AbortSignal,
  timeoutMs: number,
  onDelta: (text: string) => void,
): Promise<Pick<OpenAI.Chat.Completions.ChatCompletion, 'choices' | 'usage'>> {
  const stream = await clientFor(spec).chat.completions.create(
    { ...body, stream: true, stream_options: { include_usage: true } },
    { signal, timeout: timeoutMs },
  );
  let content: string | null = null;
  let finish: string | null = null;
  let usage: OpenAI.Completions.CompletionUsage | undefined;
  const calls: ChunkToolCall[] = [];
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices?.[0];
    if (!choice) continue;
    if (choice.finish_reason) finish = choice.finish_reason;
    const d = choice.delta;
    if (typeof d?.content === 'string' && d.content !== '') {
      content = (content ?? '') + d.content;
      onDelta(d.content);
    }
    for (const tc of d?.tool_calls ?? []) {
      const c = (calls[tc.index] ??= {});
      if (tc.id) c.id = tc.id;
      if (tc.type) c.type = tc.type;
      if (tc.function?.name) (c.function ??= {}).name = (c.function.name ?? '') + tc.function.name;
      if (tc.function?.arguments !== undefined) (c.function ??= {}).arguments = (c.function.arguments ?? '') + tc.function.arguments;
    }
  }
  const toolCalls = calls.filter(Boolean).map((c) => ({ ...c, type: c.type ?? 'function' }));
  const message = { role: 'assistant', content, ...(toolCalls.length ? { tool_calls: toolCalls } : {}) };
  return {
    choices: [{ index: 0, message, finish_reason: finish, logprobs: null }] as unknown as OpenAI.Chat.Completions.ChatCompletion['choices'],
    ...(usage ? { usage } : {}),
  };
}
