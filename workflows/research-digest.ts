/**
 * research-digest: the run graph in one workflow — a fan-out of three searches, a join that
 * picks articles, a map that summarises each (at most 3 leased at once per run), a merge, and a
 * child run that publishes the digest once through the fenced report receiver (POST /reports,
 * Idempotency-Key + X-Execution-Fence, as publish-report does). Plus the child workflow it starts.
 * The searches and summaries are pure (no service); only the publish acts on the world.
 * Services: examples/services.ts (base URL from RATCHET_EXAMPLE_SERVICES_URL). Run it:
 *   node bin/ratchet.mjs run research-digest --with-services --input '{"topic":"leases","digestId":"d-1"}'
 */
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../src/index.js';
import { fencedPost, getFromService } from './_lib/http.js';

const io = defineToolClass({
  name: 'digest-io',
  lease: '30s',
  heartbeat: '5s',
  timeout: '20s',
  maxDuration: '2m',
  retry: { maxAttempts: 5, backoff: { initial: '250ms', factor: 2, max: '5s' } },
});

const hits = z.object({ source: z.string(), urls: z.array(z.string()) });
const search = (source: string) =>
  defineTool({
    name: `search_${source}`,
    description: `Searches ${source} for a topic.`,
    class: io,
    input: z.object({ topic: z.string() }),
    output: hits,
    run: async ({ topic }) => ({ source, urls: [1, 2].map((i) => `https://${source}.example/${encodeURIComponent(topic)}/${i}`) }),
  });

const pick = defineTool({
  name: 'pick_articles',
  description: 'Keeps the distinct articles of every source that answered.',
  class: io,
  input: z.object({ lists: z.array(hits) }),
  output: z.object({ urls: z.array(z.string()) }),
  run: async ({ lists }) => ({ urls: [...new Set(lists.flatMap((l) => l.urls))] }),
});

const summarise = defineTool({
  name: 'summarise',
  description: 'Summarises one article.',
  class: io,
  input: z.object({ url: z.string() }),
  output: z.object({ url: z.string(), summary: z.string() }),
  run: async ({ url }) => ({ url, summary: `about ${url.split('/').slice(-2).join(' ')}` }),
});

const merge = defineTool({
  name: 'merge',
  description: 'Merges the summaries into one digest text.',
  class: io,
  input: z.object({ parts: z.array(z.object({ url: z.string(), summary: z.string() })) }),
  output: z.object({ text: z.string() }),
  run: async ({ parts }) => ({ text: parts.map((p) => `- ${p.summary} (${p.url})`).join('\n') }),
});

const published = z.object({ reportId: z.string(), key: z.string(), url: z.string(), replayed: z.boolean() });
const publishedBody = published.omit({ replayed: true });

const publish = defineTool({
  name: 'publish_digest',
  description: 'Publishes the digest to the report service, once per digest id (fenced POST /reports).',
  class: io,
  input: z.object({ digestId: z.string(), text: z.string() }),
  output: published,
  idempotencyKey: ({ digestId }) => `digest:${digestId}:publish`,
  async run({ digestId, text }, ctx) {
    const body = { reportId: digestId, title: `Digest ${digestId}`, markdown: text, reviewedBy: 'research-digest' };
    const answer = await fencedPost('/reports', body, ctx);
    return { ...publishedBody.parse(answer.body), replayed: answer.replayed };
  },
  /** An earlier attempt sent the POST and its answer was lost: ask whether the digest exists. */
  async reconcile(_input, ctx) {
    const answer = await getFromService(`/reports/${encodeURIComponent(ctx.idempotencyKey)}`, ctx, { allowMissing: true });
    return answer ? { done: true, output: { ...publishedBody.parse(answer.body), replayed: true } } : { done: false };
  },
});

/** The child workflow: a run of its own, started by the parent's `publish` step and keyed by it. */
export const publishDigest = defineWorkflow({
  name: 'publish-digest',
  input: z.object({ digestId: z.string(), text: z.string() }),
  steps: [{ tool: publish }],
});

type Hits = z.infer<typeof hits>;

export const researchDigest = defineWorkflow({
  name: 'research-digest',
  input: z.object({ topic: z.string(), digestId: z.string(), forums: z.boolean().default(false) }),
  steps: [
    // Three searches start with the run; the forum one only when asked (else `skipped`).
    { tool: search('news'), input: ({ input }) => ({ topic: input.topic }) },
    { tool: search('papers'), after: [], input: ({ input }) => ({ topic: input.topic }) },
    { tool: search('forums'), after: [], when: ({ input }) => input.forums, input: ({ input }) => ({ topic: input.topic }) },
    // The join: once, after all three (a skipped search is absent from `results`).
    {
      tool: pick,
      after: ['search_news', 'search_papers', 'search_forums'],
      input: ({ results }) => ({
        lists: ['search_news', 'search_papers', 'search_forums'].flatMap((k) => (results[k] ? [results[k] as Hits] : [])),
      }),
    },
    // One stage per article, at most 3 leased at once for this run; the output is the summaries in order.
    {
      name: 'summaries',
      map: {
        items: ({ results }) => (results.pick_articles as { urls: string[] }).urls,
        tool: summarise,
        input: (url: string) => ({ url }),
        maxParallel: 3,
      },
    },
    { tool: merge, input: ({ results }) => ({ parts: results.summaries }) },
    // A child run, started once (keyed by this stage) and waited for without a lease.
    {
      name: 'publish',
      workflow: publishDigest,
      input: ({ input, results }) => ({ digestId: input.digestId, text: (results.merge as { text: string }).text }),
    },
  ],
});

export default [researchDigest, publishDigest];
