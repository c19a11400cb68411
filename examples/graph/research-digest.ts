/**
 * research-digest: the run graph in one workflow — a fan-out of three searches, a join that
 * picks articles, a map that summarises each (at most 3 leased at once per run), a merge, and a
 * child run that publishes the digest. Plus the child workflow it starts.
 *
 * The tools are pure so the example needs no service. Run it on the embedded store:
 *   npx tsx examples/graph/research-digest.ts [--forums]
 * It submits one run, works it with one worker and prints each stage's state and the result.
 */
import { pathToFileURL } from 'node:url';
import { z } from 'zod';
import { createRatchet, defineTool, defineToolClass, defineWorkflow } from '../../src/index.js';
import { silentLogger } from '../../src/logger.js';

const io = defineToolClass({ name: 'digest-io', lease: '30s', heartbeat: '5s', timeout: '20s', maxDuration: '2m' });

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

const publish = defineTool({
  name: 'publish_digest',
  description: 'Publishes a digest once per digest id (a real tool sends ctx.fence and its key to a fenced receiver).',
  class: io,
  input: z.object({ digestId: z.string(), text: z.string() }),
  output: z.object({ published: z.string() }),
  idempotencyKey: ({ digestId }) => `digest:${digestId}:publish`,
  run: async ({ digestId }) => ({ published: digestId }),
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

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const r = await createRatchet({ dataDir: ':memory:', workflows: [researchDigest, publishDigest], logger: silentLogger() });
  try {
    await r.worker({ pollIntervalMs: 20 }).start();
    const forums = process.argv.includes('--forums');
    const { id } = await r.submit('research-digest', { topic: 'leases', digestId: 'd-1', forums });
    let run = await r.getRun(id);
    for (let i = 0; i < 500 && run && !['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state); i++) {
      await new Promise((res) => setTimeout(res, 20));
      run = await r.getRun(id);
    }
    const full = (await r.store.getRun(id))!;
    console.log(`run ${id}: ${full.state}`);
    for (const s of full.stages)
      console.log(`  ${String(s.seq).padStart(8)} ${s.name.padEnd(16)} ${s.state.padEnd(10)} after [${(s.deps ?? []).join(', ')}]`);
    for (const c of full.children ?? []) console.log(`  child run ${c.id} (${c.workflow}): ${c.state}`);
    console.log(JSON.stringify(full.result, null, 2));
  } finally {
    await r.close();
  }
}
