import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startScriptedModel, type ChatRequest, type ScriptedAnswer, type ScriptedModel } from '../../src/agent/scripted-model.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass, defineWorkflow, defineWorkflowTool } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { PermanentError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import type { RunView } from '../../src/engine.js';
import type { Worker } from '../../src/worker/worker.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * An agent calls another workflow or agent as a tool (defineWorkflowTool, issue 11) on PostgreSQL
 * with a scripted model and a real worker in this process: the call starts ONE child run keyed by
 * its stage (runs.parent_stage_id), the stage waits without a lease, and the child's result is the
 * tool's answer at the next model call; a failed child is a tool error told to the model
 * (tell_model) or fails the run (onToolError 'fail'); a sub-agent (an agent as a tool) runs on the
 * same scripted model; a worker stopped mid-child and started again still leaves one child;
 * cancelling the parent cancels the child; explain says waiting_for_child with the child's verdict.
 */
const llm = defineToolClass({
  name: 'wt_llm',
  lease: '5s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '4s',
  maxDuration: '30s',
  retry: { maxAttempts: 2, backoff: { initial: '50ms' } },
});
const io = defineToolClass({
  name: 'wt_io',
  lease: '3s',
  heartbeat: '500ms',
  jitter: '100ms',
  timeout: '20s',
  maxDuration: '60s',
  retry: { maxAttempts: 3, backoff: { initial: '50ms' } },
});

const digs: string[] = [];
const dig = defineTool({
  name: 'dig',
  description: 'digs facts about a topic',
  class: io,
  input: z.object({ topic: z.string() }),
  output: z.object({ topic: z.string(), facts: z.array(z.string()) }),
  run: async ({ topic }) => {
    digs.push(topic);
    if (topic.startsWith('once') && digs.filter((t) => t === topic).length === 1)
      throw new PermanentError(`not yet: ${topic}`, { code: 'not_yet' });
    if (topic.startsWith('bad')) throw new PermanentError(`nothing to dig about ${topic}`, { code: 'no_facts' });
    return { topic, facts: [`${topic} is old`, `${topic} is big`] };
  },
});
const research = defineWorkflow({ name: 'wt_research', input: z.object({ topic: z.string() }), steps: [{ tool: dig }] });

/** Holds until aborted the first `holds` times (recording the abort reason), then answers. */
const holding = { holds: 0, started: 0, reasons: [] as string[], effects: 0 };
const hold = defineTool({
  name: 'hold',
  description: 'waits',
  class: io,
  input: z.object({ topic: z.string() }),
  output: z.unknown(),
  run: async ({ topic }, ctx) => {
    holding.started++;
    if (holding.holds-- > 0) {
      const reason = await new Promise<string>((resolve) =>
        ctx.signal.addEventListener('abort', () => resolve((ctx.signal.reason as { code: string }).code), { once: true }),
      );
      holding.reasons.push(reason);
      throw ctx.signal.reason;
    }
    holding.effects++;
    return { topic, held: true };
  },
});
const slow = defineWorkflow({ name: 'wt_slow', input: z.object({ topic: z.string() }), steps: [{ tool: hold }] });

/** The scripted model answers each agent (told apart by its instructions) from its own list. */
const scripts: Record<string, ScriptedAnswer[]> = {};
const served: Record<string, number> = {};
const who = (req: ChatRequest) => String(req.messages.find((m) => m.role === 'system')?.content ?? '');
const forAgent = (req: ChatRequest): ScriptedAnswer => {
  const k = Object.keys(scripts).find((name) => who(req).includes(`[${name}]`));
  if (!k) return { content: 'unscripted' };
  const i = served[k] ?? 0;
  served[k] = i + 1;
  return scripts[k]![i] ?? { content: 'done' };
};

describe('an agent calls a workflow or an agent as a tool: a durable child run (PostgreSQL)', () => {
  let db: TestDatabase;
  let model: ScriptedModel;
  let r: Ratchet;
  let worker: Worker;
  const startWorker = async () => {
    worker = r.worker({ pollIntervalMs: 50, concurrency: 4, sweepIntervalMs: 200 });
    await worker.start();
  };
  beforeAll(async () => {
    db = await createTestDatabase('agent_workflow_tool');
    model = await startScriptedModel({ script: (req) => forAgent(req) });
    const m = { name: 'scripted', class: llm, baseURL: model.baseURL };
    const sub = defineAgent({ ...helperOptions(), model: m });
    const agent = (name: string, tools: ReturnType<typeof defineWorkflowTool>[], extra: Record<string, unknown> = {}) =>
      defineAgent({ name, input: z.object({ q: z.string() }), model: m, instructions: `[${name}] use your tools`, tools, ...extra });
    const researchTool = defineWorkflowTool({ workflow: research, description: 'researches a topic' });
    r = await createRatchet({
      databaseUrl: db.url,
      logger: silentLogger(),
      workflows: [
        research,
        slow,
        sub,
        agent('boss', [researchTool]),
        agent('strict', [researchTool], { onToolError: 'fail' }),
        agent('manager', [defineWorkflowTool({ workflow: sub, name: 'ask_helper', description: 'asks a helper agent' })]),
        agent('waiter', [defineWorkflowTool({ workflow: slow, description: 'waits a while' })]),
      ],
    });
    await startWorker();
  });
  afterAll(async () => {
    await r?.close();
    await model?.close();
    await db?.drop();
  });
  const ended = async (id: string): Promise<RunView> => {
    for (let i = 0; i < 800; i++) {
      const v = (await r.getRun(id))!;
      if (['succeeded', 'failed', 'cancelled', 'expired'].includes(v.state)) return v;
      await new Promise((res) => setTimeout(res, 25));
    }
    throw new Error(`run ${id} did not end`);
  };
  const script = (name: string, answers: ScriptedAnswer[]) => {
    scripts[name] = answers;
    served[name] = 0;
  };
  /** The requests of one agent's model calls, in order. */
  const requestsOf = (name: string) => model.requests.filter((q) => who(q).includes(`[${name}]`));
  const childRows = (id: string) =>
    db.query<{ id: string; parent_stage_id: string; state: string }>(
      `SELECT id::text, parent_stage_id::text, state FROM ratchet.runs WHERE parent_run_id = $1`,
      [id],
    );

  it("starts one child keyed by the calling stage; the model's next call sees the child's result; the parent succeeds", async () => {
    script('boss', [{ toolCalls: [{ name: 'wt_research', arguments: { topic: 'rome' }, id: 'r1' }] }, { content: 'Rome is old.' }]);
    const before = requestsOf('boss').length;
    const { id } = await r.submit('boss', { q: 'tell me about rome' });
    const v = await ended(id);
    expect(v.state).toBe('succeeded');
    expect(v.result).toEqual({ answer: 'Rome is old.' });
    expect(v.stages.map((s) => [s.tool, s.state])).toEqual([
      ['$model', 'succeeded'],
      ['wt_research', 'succeeded'],
      ['$model', 'succeeded'],
    ]);
    const kids = await childRows(id);
    expect(kids).toHaveLength(1);
    const [toolStage] = await db.query<{ id: string; tool_class: string }>(
      `SELECT id::text, tool_class FROM ratchet.stages WHERE run_id = $1 AND seq = 2`,
      [id],
    );
    expect(kids[0]).toMatchObject({ parent_stage_id: toolStage!.id, state: 'succeeded' });
    expect(toolStage!.tool_class).toBe('$control');
    const kid = (await r.store.getRun(kids[0]!.id))!;
    expect(kid).toMatchObject({ workflow: 'wt_research', input: { topic: 'rome' }, parentRunId: id });
    const told = requestsOf('boss')[before + 1]!.messages.find((m) => m.tool_call_id === 'r1')!;
    expect(JSON.parse(told.content as string)).toEqual({ topic: 'rome', facts: ['rome is old', 'rome is big'] });
    const types = (await r.events(id)).map((e) => e.type);
    expect(types.filter((t) => t === 'child_run_started')).toHaveLength(1);
  });

  it('two workflow-tool calls in one answer: two children in parallel, the next model call sees both results', async () => {
    script('boss', [
      {
        toolCalls: [
          { name: 'wt_research', arguments: { topic: 'oslo' }, id: 'p1' },
          { name: 'wt_research', arguments: { topic: 'bergen' }, id: 'p2' },
        ],
      },
      { content: 'Both found.' },
    ]);
    const before = requestsOf('boss').length;
    const { id } = await r.submit('boss', { q: 'norway' });
    const v = await ended(id);
    expect(v.state).toBe('succeeded');
    const kids = await childRows(id);
    expect(kids).toHaveLength(2);
    expect(new Set(kids.map((k) => k.parent_stage_id)).size).toBe(2);
    const msgs = requestsOf('boss')[before + 1]!.messages;
    expect(JSON.parse(msgs.find((m) => m.tool_call_id === 'p1')!.content as string)).toMatchObject({ topic: 'oslo' });
    expect(JSON.parse(msgs.find((m) => m.tool_call_id === 'p2')!.content as string)).toMatchObject({ topic: 'bergen' });
  });

  it('a failed child is a tool error told to the model (tell_model), which goes on', async () => {
    script('boss', [
      { toolCalls: [{ name: 'wt_research', arguments: { topic: 'bad-atlantis' }, id: 'b1' }] },
      { content: 'Atlantis could not be researched.' },
    ]);
    const before = requestsOf('boss').length;
    const { id } = await r.submit('boss', { q: 'atlantis' });
    const v = await ended(id);
    expect(v.state).toBe('succeeded');
    expect(v.stages.map((s) => s.state)).toEqual(['succeeded', 'failed', 'succeeded']);
    const told = JSON.parse(requestsOf('boss')[before + 1]!.messages.find((m) => m.tool_call_id === 'b1')!.content as string);
    expect(told).toMatchObject({ error: 'tool_failed', code: 'child_run_failed' });
    expect(told.message).toContain('nothing to dig about bad-atlantis');
    expect(await childRows(id)).toEqual([expect.objectContaining({ state: 'failed' })]);
  });

  it("a failed child fails the run under onToolError 'fail'", async () => {
    script('strict', [{ toolCalls: [{ name: 'wt_research', arguments: { topic: 'bad-mu' }, id: 's1' }] }, { content: 'never asked' }]);
    const before = requestsOf('strict').length;
    const { id } = await r.submit('strict', { q: 'mu' });
    const v = await ended(id);
    expect(v.state).toBe('failed');
    expect(v.error).toMatchObject({ code: 'child_run_failed' });
    expect(requestsOf('strict').length - before).toBe(1);
    expect(await childRows(id)).toHaveLength(1);
  });

  it("retry of a run failed by its child under 'fail' retries that child in place: one child, the model told its result", async () => {
    script('strict', [
      { toolCalls: [{ name: 'wt_research', arguments: { topic: 'once-lemuria' }, id: 'o1' }] },
      { content: 'Lemuria, at last.' },
    ]);
    const { id } = await r.submit('strict', { q: 'lemuria' });
    let v = await ended(id);
    expect(v.state).toBe('failed');
    expect(v.error).toMatchObject({ code: 'child_run_failed' });
    const [kid] = await childRows(id);
    expect(await r.retry(id)).toMatchObject({ retried: true });
    v = await ended(id);
    expect(v.state).toBe('succeeded');
    expect(v.result).toEqual({ answer: 'Lemuria, at last.' });
    expect(await childRows(id)).toEqual([expect.objectContaining({ id: kid!.id, state: 'succeeded' })]);
    expect(digs.filter((t) => t === 'once-lemuria')).toHaveLength(2);
  });

  it('a sub-agent (an agent offered as a tool) runs as a durable child run on the scripted model', async () => {
    script('manager', [
      { toolCalls: [{ name: 'ask_helper', arguments: { question: 'what about paris?' }, id: 'm1' }] },
      { content: 'The helper says Paris is old.' },
    ]);
    script('wt_helper', [{ toolCalls: [{ name: 'dig', arguments: { topic: 'paris' }, id: 'h1' }] }, { content: 'Paris is old.' }]);
    const before = requestsOf('manager').length;
    const { id } = await r.submit('manager', { q: 'paris' });
    const v = await ended(id);
    expect(v.state).toBe('succeeded');
    expect(v.result).toEqual({ answer: 'The helper says Paris is old.' });
    const kids = await childRows(id);
    expect(kids).toHaveLength(1);
    const kid = (await r.getRun(kids[0]!.id))!;
    expect(kid).toMatchObject({ workflow: 'wt_helper', state: 'succeeded', result: { answer: 'Paris is old.' } });
    expect(kid.stages.map((s) => s.tool)).toEqual(['$model', 'dig', '$model']);
    // The sub-agent's model saw its question as its input.
    expect(JSON.stringify(requestsOf('wt_helper')[0]!.messages)).toContain('what about paris?');
    const told = requestsOf('manager')[before + 1]!.messages.find((m) => m.tool_call_id === 'm1')!;
    expect(JSON.parse(told.content as string)).toEqual({ answer: 'Paris is old.' });
  });

  it('a worker stopped mid-child and started again: still one child, the tool effect once, the parent succeeds', async () => {
    holding.holds = 1;
    holding.started = 0;
    holding.effects = 0;
    holding.reasons = [];
    script('waiter', [{ toolCalls: [{ name: 'wt_slow', arguments: { topic: 'x' }, id: 'w1' }] }, { content: 'waited' }]);
    const { id } = await r.submit('waiter', { q: 'wait' });
    for (let i = 0; i < 400 && holding.started === 0; i++) await new Promise((res) => setTimeout(res, 25));
    expect(holding.started).toBe(1);
    const parent = (await r.getRun(id))!;
    expect(parent.stages[1]).toMatchObject({ tool: 'wt_slow', state: 'waiting' });
    await worker.stop({ graceMs: 0 });
    expect(holding.reasons).toEqual(['shutdown']);
    await startWorker();
    const v = await ended(id);
    expect(v.state).toBe('succeeded');
    expect(v.result).toEqual({ answer: 'waited' });
    const stageId = (await r.store.getRun(id))!.stages[1]!.id;
    expect(await childRows(id)).toEqual([expect.objectContaining({ state: 'succeeded', parent_stage_id: stageId })]);
    expect(holding.effects).toBe(1);
    expect(holding.started).toBe(2);
    const types = (await r.events(id)).map((e) => e.type);
    expect(types.filter((t) => t === 'child_run_started')).toHaveLength(1);
  });

  it("explain says waiting_for_child with the child's verdict; cancelling the parent cancels the child", async () => {
    holding.holds = 1;
    holding.started = 0;
    holding.reasons = [];
    script('waiter', [{ toolCalls: [{ name: 'wt_slow', arguments: { topic: 'y' }, id: 'c1' }] }, { content: 'never' }]);
    const { id } = await r.submit('waiter', { q: 'wait' });
    for (let i = 0; i < 400 && holding.started === 0; i++) await new Promise((res) => setTimeout(res, 25));
    expect(holding.started).toBe(1);
    const ex = await r.explain(id);
    expect(ex.verdict).toBe('waiting_for_child');
    const childRunId = (ex.evidence as { childRunId: string }).childRunId;
    expect(ex.evidence).toMatchObject({ workflow: 'wt_slow', childVerdict: (await r.explain(childRunId)).verdict });
    await r.cancel(id);
    for (let i = 0; i < 400 && holding.reasons.length === 0; i++) await new Promise((res) => setTimeout(res, 25));
    expect(holding.reasons).toEqual(['cancelled']);
    const v = await ended(id);
    expect(v.state).toBe('cancelled');
    const kid = await ended(childRunId);
    expect(kid.state).toBe('cancelled');
    expect(kid.stages.map((s) => s.state)).toEqual(['cancelled']);
  });
});

function helperOptions() {
  return {
    name: 'wt_helper',
    input: z.object({ question: z.string() }),
    instructions: '[wt_helper] answer the question',
    tools: [dig],
  };
}
