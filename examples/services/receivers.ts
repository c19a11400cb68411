import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import type { HttpHandler } from '../../src/receiver/index.js';
import type { PoolLike } from './pglite-pool.js';

/**
 * The receivers' own tables and effect handlers. Each handler writes through the guard's
 * transaction (`tx`), so the case or report commits together with the guard's record of the
 * key: one effect per Idempotency-Key, whatever the retries.
 */
export const SCHEMA_STATEMENTS = [
  'CREATE SCHEMA IF NOT EXISTS examples',
  `CREATE TABLE IF NOT EXISTS examples.cases (
    key text PRIMARY KEY, case_id text NOT NULL UNIQUE, invoice_id text NOT NULL, vendor text NOT NULL,
    currency text NOT NULL, total_cents bigint NOT NULL, paid_cents bigint NOT NULL, difference_cents bigint NOT NULL,
    outcome text NOT NULL, status text NOT NULL, fence bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`,
  `CREATE TABLE IF NOT EXISTS examples.reports (
    key text PRIMARY KEY, report_id text NOT NULL, title text NOT NULL, markdown text NOT NULL, reviewed_by text NOT NULL,
    fence bigint NOT NULL, published_at timestamptz NOT NULL DEFAULT now())`,
];

const caseRequest = z.object({
  invoiceId: z.string().min(1),
  vendor: z.string().min(1),
  currency: z.string().length(3),
  totalCents: z.number().int(),
  paidCents: z.number().int(),
  differenceCents: z.number().int(),
});
const reportRequest = z.object({
  reportId: z.string().min(1),
  title: z.string().min(1),
  markdown: z.string().min(1),
  reviewedBy: z.string().min(1),
});

const invalid = (error: z.ZodError) => ({
  status: 400,
  body: { error: 'invalid_body', issues: error.issues.map((i) => `${i.path.join('.')}: ${i.message}`) },
});

export const caseView = (r: { case_id: string; key: string; outcome: string; status: string }) => ({
  caseId: r.case_id,
  key: r.key,
  outcome: r.outcome,
  status: r.status,
});

/** POST /cases: opens a reconciliation case (a discrepancy case when the invoice was under- or overpaid). */
export const createCaseHandler: HttpHandler = async ({ key, fence, body, tx }) => {
  const parsed = caseRequest.safeParse(body);
  if (!parsed.success) return invalid(parsed.error);
  const c = parsed.data;
  const outcome = c.differenceCents === 0 ? 'balanced' : 'discrepancy';
  const row = { case_id: `case-${randomUUID().slice(0, 8)}`, key, outcome, status: outcome === 'balanced' ? 'closed' : 'open' };
  await tx.query(
    `INSERT INTO examples.cases (key, case_id, invoice_id, vendor, currency, total_cents, paid_cents, difference_cents, outcome, status, fence)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::bigint)`,
    [key, row.case_id, c.invoiceId, c.vendor, c.currency, c.totalCents, c.paidCents, c.differenceCents, outcome, row.status, fence],
  );
  return { status: 201, body: caseView(row) };
};

export const reportView = (r: { report_id: string; key: string }) => ({
  reportId: r.report_id,
  key: r.key,
  url: `/reports/${encodeURIComponent(r.key)}`,
});

/** POST /reports: publishes a report. */
export const publishReportHandler: HttpHandler = async ({ key, fence, body, tx }) => {
  const parsed = reportRequest.safeParse(body);
  if (!parsed.success) return invalid(parsed.error);
  const r = parsed.data;
  await tx.query(
    'INSERT INTO examples.reports (key, report_id, title, markdown, reviewed_by, fence) VALUES ($1, $2, $3, $4, $5, $6::bigint)',
    [key, r.reportId, r.title, r.markdown, r.reviewedBy, fence],
  );
  return { status: 201, body: reportView({ report_id: r.reportId, key }) };
};

export async function findCase(pool: PoolLike, key: string) {
  const { rows } = await pool.query<{ case_id: string; key: string; outcome: string; status: string }>(
    'SELECT case_id, key, outcome, status FROM examples.cases WHERE key = $1',
    [key],
  );
  return rows[0] ? caseView(rows[0]) : null;
}

export async function findReport(pool: PoolLike, key: string) {
  const { rows } = await pool.query<{ report_id: string; key: string }>('SELECT report_id, key FROM examples.reports WHERE key = $1', [
    key,
  ]);
  return rows[0] ? reportView(rows[0]) : null;
}
