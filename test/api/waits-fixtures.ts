import { expect } from 'vitest';
import { z } from 'zod';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import type { Step, Workflow } from '../../src/definitions/types.js';
import type { Ratchet } from '../../src/engine.js';
import { MODEL_STAGE_TOOL } from '../../src/definitions/agent.js';
import type { Queryable } from '../../src/store/db.js';
import { planStaticRun } from '../../src/planner/plan.js';
import { beginWait } from '../../src/store/signals.js';

/**
 * Workflows that wait (issue 10). The API tests create their runs with store.createRun (no
 * worker) and play the claim's part by hand (claimStage + beginWait), as the executor does;
 * test/worker/waits-run.test.ts runs them through a real worker.
 */
export const io = defineToolClass({ name: 'wio', lease: '90s', heartbeat: '30s', timeout: '60s', maxDuration: '10m' });
const model = defineToolClass({ name: 'wmodel', lease: '90s', heartbeat: '30s', timeout: '60s', maxDuration: '10m' });
export const caseInput = z.object({ invoiceId: z.string().min(1), amount: z.number().positive() });
export const createCase = defineTool({
  name: 'create_case',
  description: 'files a case (irreversible)',
  class: io,
  input: caseInput,
  output: z.object({ caseId: z.string() }),
  approval: true,
  approvalTimeout: '1h',
  run: async (i) => ({ caseId: `case-${i.invoiceId}` }),
});
const step = (name: string) =>
  defineTool({ name, description: name, class: io, input: z.unknown(), output: z.unknown(), run: async () => ({ ok: name }) });
export const prep = step('prep');
export const ship = step('ship');
export const paid = z.object({ paid: z.boolean(), ref: z.string() });

export const gated = defineWorkflow({
  name: 'gated',
  input: caseInput,
  steps: [{ tool: createCase, input: ({ input }) => input }, { tool: ship }],
});
export const hooked = defineWorkflow({
  name: 'hooked',
  input: z.object({}),
  steps: [{ tool: prep }, { waitForSignal: { name: 'paid', schema: paid, timeout: '1h' } }, { tool: ship }],
});
export const napper = defineWorkflow({ name: 'napper', input: z.object({}), steps: [{ sleep: '10m' }, { tool: ship }] });
export const gatedAgent = defineAgent({
  name: 'gated_agent',
  input: z.object({}),
  model: { name: 'm', class: model },
  instructions: 'file cases',
  tools: [createCase],
});
export const waitWorkflows: Workflow[] = [gated, hooked, napper, gatedAgent];

/** The stage states graph2's migration allows plus awaiting_approval (this branch lists it for schema.ts): for the test database only. */
export async function allowWaitStates(q: Queryable): Promise<void> {
  await q.query(`ALTER TABLE ratchet.stages DROP CONSTRAINT IF EXISTS stages_state_ck`);
  await q.query(
    `ALTER TABLE ratchet.stages ADD CONSTRAINT stages_state_ck CHECK (state in ('pending','queued','running','succeeded','failed','cancelled','skipped','waiting','awaiting_approval'))`,
  );
}

const spec = (s: Pick<Step, 'name' | 'tool'>) => ({
  name: s.name,
  tool: s.tool.name,
  toolClass: s.tool.class.name,
  leaseMs: s.tool.class.leaseMs,
  timeoutMs: s.tool.class.timeoutMs,
  maxDurationMs: s.tool.class.maxDurationMs,
  maxAttempts: s.tool.retry.maxAttempts,
});

/** A run of a static waiting workflow, as submit makes it (its plan: the run graph, first stage queued with its input). */
export async function createWaitRun(r: Ratchet, wf: Workflow, input: unknown): Promise<{ id: string; stageIds: string[] }> {
  const plan = planStaticRun(wf, input);
  const stages = plan.stages.map((s, i) => (i === 0 ? { ...s, input } : s));
  const c = await r.store.createRun({ workflow: wf.name, definitionHash: wf.hash, input, stages, sinksLeft: plan.sinksLeft });
  return { id: c.id, stageIds: c.stageIds };
}

/** An agent run after its first model call proposed one create_case call: model (succeeded), the call, the next model call (pending). */
export async function createAgentRun(r: Ratchet, callInput: unknown): Promise<{ id: string; stageIds: string[] }> {
  const m = { name: 'model', tool: { name: MODEL_STAGE_TOOL, class: model, retry: model.retry } } as unknown as Step;
  const call = { name: 'call_1', tool: createCase } as unknown as Step;
  const c = await r.store.createRun({
    workflow: gatedAgent.name,
    definitionHash: gatedAgent.hash,
    input: {},
    stages: [
      { ...spec(m), deps: [], nextSeqs: [2] },
      { ...spec(call), input: callInput, deps: [1], nextSeqs: [3], continueOnError: true },
      { ...spec(m), name: 'model_2', deps: [2], nextSeqs: [] },
    ],
  });
  await r.store.db.query(`UPDATE ratchet.stages SET state = 'succeeded', result = '{}' WHERE id = $1`, [c.stageIds[0]]);
  await r.store.db.query(`UPDATE ratchet.stages SET state = 'queued' WHERE id = $1`, [c.stageIds[1]]);
  await r.store.db.query(`UPDATE ratchet.runs SET state = 'running' WHERE id = $1`, [c.id]);
  return { id: c.id, stageIds: c.stageIds };
}

/** A gated run whose first stage waits for a person (the claim decided approval(input) = true), as claim + beginWait leave it. */
export async function awaitingApproval(
  r: Ratchet,
  input: unknown = { invoiceId: 'inv-1', amount: 120 },
): Promise<{ id: string; stageIds: string[] }> {
  const run = await createWaitRun(r, gated, input);
  const lease = await claimStage(r.store.db, run.stageIds[0]!);
  const w = await beginWait(r.store.db, lease, { kind: 'approval', until: { inMs: 3_600_000 } });
  expect(w.verdict).toBe('waiting');
  return run;
}

/** The claim's part, by hand: the stage leased to `owner` with a fresh fence (as claim.sql.ts does). */
export async function claimStage(q: Queryable, stageId: string, owner = 'w1'): Promise<{ stageId: string; owner: string; fence: string }> {
  const [r] = await q.query(
    `UPDATE ratchet.stages SET state = 'running', owner_id = $2, fence = nextval('ratchet.fence_seq'), attempt = attempt + 1,
       lease_until = ratchet.db_now() + interval '10 minutes', claimed_at = ratchet.db_now()
     WHERE id = $1 RETURNING fence::text`,
    [stageId, owner],
  );
  await q.query(
    `UPDATE ratchet.runs SET state = 'running' WHERE id = (SELECT run_id FROM ratchet.stages WHERE id = $1) AND state = 'queued'`,
    [stageId],
  );
  return { stageId, owner, fence: r!.fence as string };
}
