/**
 * reconcile-invoice: fetch a vendor's statement, extract its fields, and file a reconciliation
 * case with the (fenced) case service. Filing is the one irreversible step: its idempotency
 * key is derived from the invoice, so a resubmitted run replays the first case, never files a
 * second one. Services: examples/services.ts (base URL from RATCHET_EXAMPLE_SERVICES_URL).
 */
import { z } from 'zod';
import { PermanentError, defineTool, defineToolClass, defineWorkflow, type ToolContext } from '../src/index.js';
import { fencedPost, getFromService } from './_lib/http.js';

/** Calls to the statement source and the case service. */
const invoiceHttp = defineToolClass({
  name: 'invoice-http',
  lease: '30s',
  heartbeat: '5s',
  timeout: '20s',
  maxDuration: '2m',
  retry: { maxAttempts: 5, backoff: { initial: '250ms', factor: 2, max: '5s' } },
});

/** Pure computation: a failure is a bug or bad data, so one retry at most. */
const invoiceCompute = defineToolClass({
  name: 'invoice-compute',
  lease: '30s',
  heartbeat: '5s',
  timeout: '10s',
  maxDuration: '1m',
  retry: { maxAttempts: 2, backoff: { initial: '100ms' } },
});

const invoiceId = z.string().regex(/^[a-z0-9][a-z0-9-]{0,63}$/i, 'letters, digits and "-", at most 64');
const cents = z.number().int();

const statement = z.object({ invoiceId, text: z.string().min(1) });
export const fetchStatement = defineTool({
  name: 'fetch_statement',
  description: "Fetches the vendor's plain-text statement of account for an invoice.",
  class: invoiceHttp,
  input: z.object({ invoiceId }),
  output: statement,
  async run({ invoiceId: id }, ctx) {
    const answer = await getFromService(`/statements/${encodeURIComponent(id)}`, ctx);
    if (typeof answer?.body !== 'string') throw new PermanentError(`statement ${id} is not text`, { code: 'bad_statement' });
    return { invoiceId: id, text: answer.body };
  },
});

const fields = z.object({
  invoiceId,
  vendor: z.string().min(1),
  currency: z.string().regex(/^[A-Z]{3}$/),
  issued: z.iso.date(),
  lineCount: z.number().int().positive(),
  totalCents: cents,
  paidCents: cents,
  differenceCents: cents,
});
type Fields = z.infer<typeof fields>;

const toCents = (amount: string) => Math.round(Number(amount) * 100);

/** Parses the statement's `Key: value` and `Line: item | qty | unit` lines; checks the total adds up. */
export function parseStatement(invoice: string, text: string): Fields {
  const field = (key: string) => {
    const m = new RegExp(`^${key}: (.+)$`, 'm').exec(text);
    if (!m) throw new PermanentError(`statement ${invoice} has no "${key}" line`, { code: 'bad_statement' });
    return m[1]!.trim();
  };
  const lines = [...text.matchAll(/^Line: (.+?) \| (\d+) \| (\d+\.\d{2})$/gm)].map((m) => Number(m[2]) * toCents(m[3]!));
  if (lines.length === 0) throw new PermanentError(`statement ${invoice} has no lines`, { code: 'bad_statement' });
  const totalCents = toCents(field('Invoice total'));
  const sum = lines.reduce((a, b) => a + b, 0);
  if (sum !== totalCents)
    throw new PermanentError(`statement ${invoice}: lines add up to ${sum} cents, total says ${totalCents}`, {
      code: 'statement_inconsistent',
    });
  const paidCents = toCents(field('Amount paid'));
  if (field('Invoice') !== invoice)
    throw new PermanentError(`statement is for ${field('Invoice')}, not ${invoice}`, { code: 'bad_statement' });
  return fields.parse({
    invoiceId: invoice,
    vendor: field('Vendor'),
    currency: field('Currency'),
    issued: field('Issued'),
    lineCount: lines.length,
    totalCents,
    paidCents,
    differenceCents: totalCents - paidCents,
  });
}

export const extractFields = defineTool({
  name: 'extract_fields',
  description: 'Extracts vendor, currency, total and amount paid from a statement of account.',
  class: invoiceCompute,
  input: statement,
  output: fields,
  run: async ({ invoiceId: id, text }) => parseStatement(id, text),
});

const filedCase = z.object({
  caseId: z.string(),
  key: z.string(),
  outcome: z.enum(['balanced', 'discrepancy']),
  status: z.string(),
  /** The case service answered from its record of an earlier request with this key. */
  replayed: z.boolean(),
});
const caseBody = z.object({ caseId: z.string(), key: z.string(), outcome: z.enum(['balanced', 'discrepancy']), status: z.string() });

/**
 * Filing a case, as a tool's parts: the pipeline below files with `file_case`, the agent of
 * invoice-agent.ts with `create_case` (the same parts behind a person's approval). One tool name
 * means one definition in a registry, hence two names; both derive the same key from the invoice,
 * so an agent run and a pipeline run for one invoice still make one case at the receiver.
 */
export const caseFiling = {
  description: 'Files a reconciliation case for an invoice with the case service (once per invoice).',
  class: invoiceHttp,
  input: fields,
  output: filedCase,
  // What the operation means, not which run asked: a resubmitted run replays the first case.
  idempotencyKey: (input: Fields) => 'invoice:' + input.invoiceId + ':create-case',
  async run(input: Fields, ctx: ToolContext): Promise<z.infer<typeof filedCase>> {
    const answer = await fencedPost('/cases', input, ctx);
    return { ...caseBody.parse(answer.body), replayed: answer.replayed };
  },
  /** An earlier attempt sent the POST and its answer was lost: ask whether the case exists. */
  async reconcile(_input: Fields, ctx: ToolContext) {
    const answer = await getFromService(`/cases/${encodeURIComponent(ctx.idempotencyKey)}`, ctx, { allowMissing: true });
    if (!answer) return { done: false as const };
    return { done: true as const, output: { ...caseBody.parse(answer.body), replayed: true } };
  },
};

export const fileCase = defineTool({ name: 'file_case', ...caseFiling });

export default defineWorkflow({
  name: 'reconcile-invoice',
  input: z.object({ invoiceId }),
  deadline: '15m',
  steps: [
    { tool: fetchStatement },
    { tool: extractFields, input: ({ results }) => results.fetch_statement },
    { tool: fileCase, input: ({ results }) => results.extract_fields },
  ],
});
