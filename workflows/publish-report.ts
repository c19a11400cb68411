/**
 * publish-report: a quarterly sales report, gather → normalise → draft → review → publish.
 * Only `publish` acts on the world: a fenced POST to the report service, keyed by the report
 * id, so a retried or resubmitted run publishes once. The other steps are reads and pure
 * computation, each result committed before the next step starts.
 * Services: examples/services.ts (base URL from RATCHET_EXAMPLE_SERVICES_URL).
 */
import { z } from 'zod';
import { PermanentError, defineTool, defineToolClass, defineWorkflow } from '../src/index.js';
import { fencedPost, getFromService } from './_lib/http.js';

const reportHttp = defineToolClass({
  name: 'report-http',
  lease: '30s',
  heartbeat: '5s',
  timeout: '20s',
  maxDuration: '2m',
  retry: { maxAttempts: 5, backoff: { initial: '250ms', factor: 2, max: '5s' } },
});
const reportCompute = defineToolClass({
  name: 'report-compute',
  lease: '30s',
  heartbeat: '5s',
  timeout: '10s',
  maxDuration: '1m',
  retry: { maxAttempts: 2, backoff: { initial: '100ms' } },
});

const reportId = z.string().regex(/^[a-z0-9][a-z0-9-]{0,63}$/i, 'letters, digits and "-", at most 64');
const period = z.string().regex(/^\d{4}-Q[1-4]$/, 'a quarter like 2024-Q2');
const region = z.enum(['emea', 'amer', 'apac']);
const request = z.object({ reportId, period, regions: z.array(region).min(1).max(3) });

// ---- gather: one read per region -------------------------------------------------------
const source = z.object({
  region,
  currency: z.string().regex(/^[A-Z]{3}$/),
  rows: z.array(z.object({ sku: z.string(), units: z.number().int().nonnegative(), revenue: z.string().regex(/^\d+\.\d{2}$/) })),
});
const gathered = z.object({ reportId, period, sources: z.array(source) });

export const gather = defineTool({
  name: 'gather',
  description: 'Reads the quarter’s sales rows of each region from the sales service.',
  class: reportHttp,
  input: request,
  output: gathered,
  async run(input, ctx) {
    const sources = [];
    for (const r of input.regions) {
      const answer = await getFromService(`/sales/${r}?period=${encodeURIComponent(input.period)}`, ctx);
      sources.push(source.parse(answer?.body));
      ctx.heartbeat({ region: r });
    }
    return { reportId: input.reportId, period: input.period, sources };
  },
});

// ---- normalise: one currency, totals per region and product -----------------------------
/** Fixed conversion rates to EUR for the demo (a real pipeline would gather them too). */
const TO_EUR: Record<string, number> = { EUR: 1, USD: 0.92, AUD: 0.61 };
const line = z.object({ revenueCents: z.number().int(), units: z.number().int() });
const normalised = z.object({
  reportId,
  period,
  currency: z.literal('EUR'),
  totalCents: z.number().int(),
  units: z.number().int(),
  regions: z.array(line.extend({ region, sourceCurrency: z.string() })),
  products: z.array(line.extend({ sku: z.string() })),
});
type Normalised = z.infer<typeof normalised>;

export function normaliseSales(data: z.infer<typeof gathered>): Normalised {
  const products = new Map<string, { revenueCents: number; units: number }>();
  const regions = data.sources.map((s) => {
    const rate = TO_EUR[s.currency];
    if (rate === undefined) throw new PermanentError(`no rate for ${s.currency}`, { code: 'unknown_currency' });
    let revenueCents = 0;
    let units = 0;
    for (const row of s.rows) {
      const eur = Math.round(Math.round(Number(row.revenue) * 100) * rate);
      revenueCents += eur;
      units += row.units;
      const p = products.get(row.sku) ?? { revenueCents: 0, units: 0 };
      products.set(row.sku, { revenueCents: p.revenueCents + eur, units: p.units + row.units });
    }
    return { region: s.region, sourceCurrency: s.currency, revenueCents, units };
  });
  return {
    reportId: data.reportId,
    period: data.period,
    currency: 'EUR',
    totalCents: regions.reduce((a, r) => a + r.revenueCents, 0),
    units: regions.reduce((a, r) => a + r.units, 0),
    regions,
    products: [...products]
      .map(([sku, p]) => ({ sku, ...p }))
      .sort((a, b) => b.revenueCents - a.revenueCents || a.sku.localeCompare(b.sku)),
  };
}

export const normalise = defineTool({
  name: 'normalise',
  description: 'Converts every region to EUR and totals revenue and units per region and product.',
  class: reportCompute,
  input: gathered,
  output: normalised,
  run: async (input) => normaliseSales(input),
});

// ---- draft: the report's text ------------------------------------------------------------
const eur = (cents: number) => `€${(cents / 100).toLocaleString('en-GB', { minimumFractionDigits: 2, maximumFractionDigits: 2 })}`;
const drafted = z.object({ reportId, title: z.string().min(1), markdown: z.string().min(1) });

export function draftReport(n: Normalised): z.infer<typeof drafted> {
  const title = `Sales report ${n.period}`;
  const markdown = [
    `# ${title}`,
    '',
    `Revenue ${eur(n.totalCents)} from ${n.units} units across ${n.regions.length} region(s).`,
    '',
    '## Regions',
    ...n.regions.map((r) => `- ${r.region.toUpperCase()}: ${eur(r.revenueCents)} (${r.units} units, booked in ${r.sourceCurrency})`),
    '',
    '## Top products',
    ...n.products.slice(0, 3).map((p, i) => `${i + 1}. ${p.sku}: ${eur(p.revenueCents)}`),
    '',
  ].join('\n');
  return { reportId: n.reportId, title, markdown };
}

export const draft = defineTool({
  name: 'draft',
  description: 'Drafts the report text (Markdown) from the normalised figures.',
  class: reportCompute,
  input: normalised,
  output: drafted,
  run: async (input) => draftReport(input),
});

// ---- review: checks the draft against the figures ----------------------------------------
const reviewInput = z.object({ draft: drafted, figures: normalised });
const reviewed = z.object({ approved: z.literal(true), reviewer: z.string(), checks: z.array(z.string()) });

export function reviewDraft({ draft: d, figures }: z.infer<typeof reviewInput>): z.infer<typeof reviewed> {
  const checks: [string, boolean][] = [
    ['total stated', d.markdown.includes(eur(figures.totalCents))],
    ['every region named', figures.regions.every((r) => d.markdown.includes(`${r.region.toUpperCase()}:`))],
    ['regions add up', figures.regions.reduce((a, r) => a + r.revenueCents, 0) === figures.totalCents],
    ['length', d.markdown.split(/\s+/).length <= 2000],
  ];
  const failed = checks.filter(([, ok]) => !ok).map(([name]) => name);
  if (failed.length > 0) throw new PermanentError(`review rejected the draft: ${failed.join(', ')}`, { code: 'review_rejected' });
  return { approved: true, reviewer: 'automatic-checks', checks: checks.map(([name]) => name) };
}

export const review = defineTool({
  name: 'review',
  description: 'Checks the draft against the figures before anything is published.',
  class: reportCompute,
  input: reviewInput,
  output: reviewed,
  run: async (input) => reviewDraft(input),
});

// ---- publish: the fenced effect -----------------------------------------------------------
const publishInput = drafted.extend({ reviewedBy: z.string() });
const published = z.object({ reportId, key: z.string(), url: z.string(), replayed: z.boolean() });
const publishedBody = published.omit({ replayed: true });

export const publish = defineTool({
  name: 'publish',
  description: 'Publishes the reviewed report to the report service (once per report id).',
  class: reportHttp,
  input: publishInput,
  output: published,
  idempotencyKey: (input) => 'report:' + input.reportId + ':publish',
  async run(input, ctx) {
    const answer = await fencedPost('/reports', input, ctx);
    return { ...publishedBody.parse(answer.body), replayed: answer.replayed };
  },
  /** An earlier attempt sent the POST and its answer was lost: ask whether the report exists. */
  async reconcile(_input, ctx) {
    const answer = await getFromService(`/reports/${encodeURIComponent(ctx.idempotencyKey)}`, ctx, { allowMissing: true });
    return answer ? { done: true, output: { ...publishedBody.parse(answer.body), replayed: true } } : { done: false };
  },
});

export default defineWorkflow({
  name: 'publish-report',
  input: request,
  deadline: '15m',
  steps: [
    { tool: gather },
    { tool: normalise, input: ({ results }) => results.gather },
    { tool: draft, input: ({ results }) => results.normalise },
    { tool: review, input: ({ results }) => ({ draft: results.draft, figures: results.normalise }) },
    {
      tool: publish,
      input: ({ results }) => ({ ...(results.draft as object), reviewedBy: (results.review as { reviewer: string }).reviewer }),
    },
  ],
});
