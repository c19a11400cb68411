/**
 * invoice-agent: the invoice reconciliation of reconcile-invoice.ts, driven by a model instead
 * of a fixed list of steps. The model proposes tool calls; Ratchet validates each proposed list
 * (allow-list + zod input) and persists it as stages, each with its own idempotency key, lease
 * and retries from its tool's class. The model call is itself a stage (class `model`), so an
 * answer is persisted once and never asked for again after a crash.
 *
 * Tools: `search` (look an invoice up at the statement source), `extract_fields` (pure parsing,
 * the very tool object of reconcile-invoice.ts) and `create_case`, the fenced, irreversible one,
 * behind an approval gate (issue 10): its stage waits in `awaiting_approval`, holding no lease and
 * no worker, until a person approves it (`ratchet approve <run> --stage <id>`, or POST
 * /v1/runs/:id/stages/:stageId/approve) or rejects it (the model then hears the rejection as the
 * tool's answer). It is reconcile-invoice.ts's case filing (`caseFiling`) under its own name, with
 * the same key derived from the invoice (`invoice:<id>:create-case`): a create_case the model
 * proposes again, in this run or another, is one case at the receiver.
 *
 * Model: any OpenAI-compatible endpoint (OPENAI_BASE_URL, OPENAI_API_KEY, read at call time),
 * model name RATCHET_MODEL (default gpt-4o-mini). `npm start` (examples/agent-demo.ts) runs it
 * against a scripted model on loopback when those are not set.
 */
import { z } from 'zod';
import { defineAgent, defineTool, defineToolClass } from '../src/index.js';
import { getFromService } from './_lib/http.js';
import { caseFiling, extractFields, fetchStatement } from './reconcile-invoice.js';

/** The model call: slow and occasionally flaky, so a long lease, a 45 s timeout and 3 attempts. */
const model = defineToolClass({
  name: 'model',
  lease: '60s',
  heartbeat: '10s',
  timeout: '45s',
  maxDuration: '3m',
  retry: { maxAttempts: 3, backoff: { initial: '1s', factor: 2, max: '10s' } },
});

const invoiceId = z.string().regex(/^[a-z0-9][a-z0-9-]{0,63}$/i, 'letters, digits and "-", at most 64');

export const search = defineTool({
  name: 'search',
  description:
    'Looks an invoice up at the statement source by its id. Returns found: false when there is no such invoice, ' +
    'else the plain-text statement of account (pass it unchanged to extract_fields).',
  // The same calls as fetch_statement: the same class (lease, timeout, retries).
  class: fetchStatement.class,
  input: z.object({ invoiceId }),
  output: z.object({ invoiceId, found: z.boolean(), text: z.string().nullable() }),
  async run({ invoiceId: id }, ctx) {
    const answer = await getFromService(`/statements/${encodeURIComponent(id)}`, ctx, { allowMissing: true });
    if (!answer) return { invoiceId: id, found: false, text: null };
    return { invoiceId: id, found: true, text: typeof answer.body === 'string' ? answer.body : JSON.stringify(answer.body) };
  },
});

/** Filing a case is irreversible: a person approves each call first (no approvalTimeout: it waits until someone decides, or the run's deadline). */
export const createCase = defineTool({ name: 'create_case', ...caseFiling, approval: true });

export default defineAgent({
  name: 'invoice-agent',
  input: z.object({ request: z.string().min(1).max(4000) }),
  model: { name: process.env.RATCHET_MODEL || 'gpt-4o-mini', class: model },
  instructions: [
    'You reconcile vendor invoices. For the invoice the user names:',
    '1. Call search with its invoiceId. If it is not found, say so and stop.',
    '2. Call extract_fields with the invoiceId and the statement text exactly as search returned it.',
    '3. Call create_case once, with the fields extract_fields returned, unchanged.',
    '4. Answer in two or three sentences: vendor, currency, total and amount paid (amounts are in cents), ' +
      'the difference, and the case id and outcome.',
    'Call one tool at a time and never invent figures.',
  ].join('\n'),
  tools: [search, extractFields, createCase],
  maxSteps: 8,
  maxReplans: 2,
  maxActions: 3,
  deadline: '15m',
});
