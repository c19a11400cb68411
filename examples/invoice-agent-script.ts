/**
 * The scripted model behind `npm start` when no real model is configured: it answers the way a
 * good model would answer workflows/invoice-agent.ts — search → extract_fields → create_case →
 * a short final answer — taking its arguments from the conversation it is sent (the user's
 * request and the tools' real results), so the figures in its answer are the statement's own.
 */
import type { ChatRequest, ScriptedAnswer } from '../src/agent/scripted-model.js';

/** How long the scripted model "thinks" before each answer (so its stage is seen running). */
const THINKING_MS = 400;

interface ToolResult {
  tool: string;
  result: Record<string, unknown>;
}

/** The tool results in the conversation, oldest first, each with the name of the tool that produced it. */
function toolResults(request: ChatRequest): ToolResult[] {
  const names = new Map<string, string>();
  const out: ToolResult[] = [];
  for (const m of request.messages) {
    for (const call of (m.tool_calls ?? []) as { id: string; function: { name: string } }[]) names.set(call.id, call.function.name);
    if (m.role === 'tool' && m.tool_call_id) {
      let result: Record<string, unknown>;
      try {
        result = JSON.parse(String(m.content)) as Record<string, unknown>;
      } catch {
        result = { error: 'unreadable tool result' };
      }
      out.push({ tool: names.get(m.tool_call_id) ?? '?', result: result ?? {} });
    }
  }
  return out;
}

/** The invoice the user asked about: "... invoice inv-42 ..." in the run's input. */
function requestedInvoice(request: ChatRequest): string | null {
  const user = request.messages.find((m) => m.role === 'user');
  const text = typeof user?.content === 'string' ? user.content : '';
  return /invoice\s+([a-z0-9][a-z0-9-]{0,63})/i.exec(text)?.[1] ?? null;
}

const money = (cents: unknown) => (Number(cents) / 100).toFixed(2);

function finalAnswer(results: ToolResult[]): string {
  const fields = [...results].reverse().find((r) => r.tool === 'extract_fields')?.result;
  const filed = [...results].reverse().find((r) => r.tool === 'create_case')?.result;
  if (!fields || !filed) return 'I could not complete the reconciliation.';
  const diff = Number(fields.differenceCents);
  const verdict =
    diff === 0
      ? 'it is fully paid'
      : diff > 0
        ? `${fields.currency} ${money(diff)} is still owed`
        : `it was overpaid by ${fields.currency} ${money(-diff)}`;
  return (
    `Invoice ${fields.invoiceId} from ${fields.vendor}: total ${fields.currency} ${money(fields.totalCents)}, ` +
    `paid ${fields.currency} ${money(fields.paidCents)}, so ${verdict}. ` +
    `I filed reconciliation case ${filed.caseId} (${filed.outcome}, ${filed.status}).`
  );
}

/** The script: a function of the conversation, so a replayed or resumed step gets the same answer. */
export function invoiceAgentScript(request: ChatRequest): ScriptedAnswer {
  const results = toolResults(request);
  const last = results.at(-1);
  const answer = (content: string): ScriptedAnswer => ({ content, delayMs: THINKING_MS });
  const call = (name: string, args: unknown): ScriptedAnswer => ({ toolCalls: [{ name, arguments: args }], delayMs: THINKING_MS });

  if (!last) {
    const invoiceId = requestedInvoice(request);
    return invoiceId ? call('search', { invoiceId }) : answer('Which invoice should I reconcile? Please give its id.');
  }
  // A person refused the filing (or no one decided in time): the refusal is create_case's answer.
  if (last.tool === 'create_case' && (last.result.error === 'approval_rejected' || last.result.error === 'approval_timeout')) {
    const invoiceId = [...results].reverse().find((r) => r.tool === 'extract_fields')?.result.invoiceId ?? requestedInvoice(request);
    const why =
      last.result.error === 'approval_timeout'
        ? 'no one approved it in time'
        : `it was rejected by ${String(last.result.decidedBy ?? 'a person')}${last.result.reason ? ` ("${String(last.result.reason)}")` : ''}`;
    return answer(`I did not file a case for invoice ${String(invoiceId)}: ${why}.`);
  }
  if ('error' in last.result) return answer(`I could not go on: ${JSON.stringify(last.result)}`);
  switch (last.tool) {
    case 'search':
      return last.result.found
        ? call('extract_fields', { invoiceId: last.result.invoiceId, text: last.result.text })
        : answer(`There is no statement for invoice ${String(last.result.invoiceId)}; I filed no case.`);
    case 'extract_fields':
      return call('create_case', last.result);
    default:
      return answer(finalAnswer(results));
  }
}
