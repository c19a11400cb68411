import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

/** One scripted answer: text, tool calls (arguments as an object or raw string), or an HTTP error. */
export type ScriptedAnswer =
  | {
      content?: string;
      toolCalls?: { name: string; arguments: unknown; id?: string }[];
      delayMs?: number;
      usage?: { prompt_tokens: number; completion_tokens: number };
      /** When the request asks to stream: the content in these pieces (default: word by word). */
      chunks?: string[];
    }
  | { status: number; body?: unknown };

export interface ScriptedModelOptions {
  /** Answers in order, or a function of the request body and its index. Past the end: "done". */
  script: ScriptedAnswer[] | ((request: ChatRequest, index: number) => ScriptedAnswer);
  port?: number;
  /** Runs before an answer is written (a test may cut a link, pause a process...). */
  beforeAnswer?: (index: number, request: ChatRequest) => Promise<void> | void;
  /** A streamed answer: runs after content piece `chunk` of answer `index` was written (a test may wait for a watcher to see it). */
  afterChunk?: (index: number, chunk: number) => Promise<void> | void;
}

export interface ChatRequest {
  model: string;
  messages: { role: string; content?: unknown; tool_call_id?: string; tool_calls?: unknown[] }[];
  tools?: { type: string; function: { name: string; description?: string; parameters: unknown } }[];
  [k: string]: unknown;
}

export interface ScriptedModel {
  /** The OpenAI base URL (…/v1). */
  baseURL: string;
  /** Every chat-completions request received, in order. */
  requests: ChatRequest[];
  close(): Promise<void>;
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString() || '{}');
}

/**
 * A scripted OpenAI-compatible chat-completions server on loopback: a real HTTP server that
 * answers POST /v1/chat/completions from a script and counts the requests. The tests and the
 * offline demo use it instead of a real model; nothing leaves the machine.
 */
export async function startScriptedModel(opts: ScriptedModelOptions): Promise<ScriptedModel> {
  const requests: ChatRequest[] = [];
  const server: Server = createServer((req, res) => {
    void (async () => {
      if (req.method !== 'POST' || !req.url?.endsWith('/chat/completions')) {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: 'not found' } }));
        return;
      }
      const body = (await readJson(req)) as ChatRequest;
      const index = requests.length;
      requests.push(body);
      const answer: ScriptedAnswer =
        typeof opts.script === 'function' ? opts.script(body, index) : (opts.script[index] ?? { content: 'done' });
      await opts.beforeAnswer?.(index, body);
      if ('status' in answer) {
        res.writeHead(answer.status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(answer.body ?? { error: { message: `scripted ${answer.status}`, type: 'scripted' } }));
        return;
      }
      if (answer.delayMs) await new Promise((r) => setTimeout(r, answer.delayMs));
      const toolCalls = answer.toolCalls?.map((c, i) => ({
        id: c.id ?? `call_${index}_${i}`,
        type: 'function',
        function: { name: c.name, arguments: typeof c.arguments === 'string' ? c.arguments : JSON.stringify(c.arguments) },
      }));
      const usage = answer.usage
        ? { ...answer.usage, total_tokens: answer.usage.prompt_tokens + answer.usage.completion_tokens }
        : { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
      if (body.stream === true) {
        // OpenAI's streaming form: chat.completion.chunk messages as server-sent events, then [DONE].
        res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
        const base = {
          id: `chatcmpl-${index}`,
          object: 'chat.completion.chunk',
          created: Math.floor(Date.now() / 1000),
          model: body.model,
        };
        const send = (choices: unknown[], extra: Record<string, unknown> = {}) =>
          res.write(`data: ${JSON.stringify({ ...base, choices, ...extra })}\n\n`);
        send([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }]);
        const pieces = answer.chunks ?? (answer.content ? (answer.content.match(/\S+\s*|\s+/g) ?? []) : []);
        for (const [i, piece] of pieces.entries()) {
          send([{ index: 0, delta: { content: piece }, finish_reason: null }]);
          await opts.afterChunk?.(index, i);
        }
        if (toolCalls?.length)
          send([{ index: 0, delta: { tool_calls: toolCalls.map((c, i) => ({ index: i, ...c })) }, finish_reason: null }]);
        send([{ index: 0, delta: {}, finish_reason: toolCalls?.length ? 'tool_calls' : 'stop' }]);
        const streamOptions = body.stream_options as { include_usage?: boolean } | undefined;
        if (streamOptions?.include_usage) send([], { usage });
        res.end('data: [DONE]\n\n');
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          id: `chatcmpl-${index}`,
          object: 'chat.completion',
          created: Math.floor(Date.now() / 1000),
          model: body.model,
          choices: [
            {
              index: 0,
              message: { role: 'assistant', content: answer.content ?? null, ...(toolCalls?.length ? { tool_calls: toolCalls } : {}) },
              finish_reason: toolCalls?.length ? 'tool_calls' : 'stop',
            },
          ],
          usage,
        }),
      );
    })().catch((err: unknown) => {
      res.writeHead(500);
      res.end(String(err));
    });
  });
  await new Promise<void>((r) => server.listen(opts.port ?? 0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  return {
    baseURL: `http://127.0.0.1:${port}/v1`,
    requests,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}
