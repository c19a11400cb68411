import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineWorkflow, type StepOptions } from '../../src/definitions/index.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { MODEL_STAGE_TOOL } from '../../src/definitions/agent.js';
import { decideAtClaim, resultsFor, type PersistedStage } from '../../src/planner/decide.js';
import { linearSuccessor, planGraphRun, runGraph } from '../../src/planner/graph.js';
import { ITEM_SEQ_STRIDE } from '../../src/planner/map.js';
import { decideFailure, failedToolCalls, toolErrorsOver } from '../../src/planner/failure.js';
import { planAgentAnswer } from '../../src/planner/agent-plan.js';
import { defineWorkflowTool } from '../../src/definitions/workflow-tool.js';
import { makeClass, makeTool } from '../definitions/fixtures.js';

const io = makeClass();
const slow = makeClass({ name: 'slow' });
const a = makeTool('a', io);
const b = makeTool('b', io);
const c = makeTool('c', io);
const d = makeTool('d', io);
const item = makeTool('item', slow, { input: z.object({ n: z.number() }) });
const RUN = '0190d3f2-0000-7000-8000-000000000001';

const wf = (steps: StepOptions[], over: { concurrencyKey?: { key: (i: unknown) => string; limit: number } } = {}) =>
  defineWorkflow({ name: 'g', input: z.object({}).passthrough(), steps, ...over });

/** A persisted stage row for the planner. */
const row = (seq: number, name: string, state: string, result: unknown = null, more: Partial<PersistedStage> = {}): PersistedStage => ({
  seq,
  name,
  state,
  result,
  error: null,
  itemIndex: null,
  groupSeq: null,
  ...more,
});

describe('runGraph and planGraphRun', () => {
  it('fan-out of 3 and a join: deps, next seqs, join counters, one sink', () => {
    const w = wf([
      { tool: a },
      { tool: b, after: ['a'] },
      { tool: c, after: ['a'] },
      { tool: d, after: ['a'] },
      { name: 'join', tool: a, after: ['b', 'c', 'd'] },
    ]);
    const { stages, sinksLeft } = planGraphRun(w, {});
    expect(stages.map((s) => [s.seq, s.deps, s.nextSeqs, s.depsLeft, s.state])).toEqual([
      [1, [], [2, 3, 4], 0, 'queued'],
      [2, [1], [5], 1, 'pending'],
      [3, [1], [5], 1, 'pending'],
      [4, [1], [5], 1, 'pending'],
      [5, [2, 3, 4], [], 3, 'pending'],
    ]);
    expect(sinksLeft).toBe(1);
    expect(stages[4]!.sink).toBe('only');
    expect([...runGraph(w).bySeq.get(5)!.ancestors].sort()).toEqual(['a', 'b', 'c', 'd']);
  });

  it('several starts and several sinks: the run ends when every sink has ended, its result keyed by name', () => {
    const w = wf([{ tool: a }, { tool: b, after: [] }, { tool: c, after: ['a'] }, { tool: d, after: ['b'] }]);
    const { stages, sinksLeft } = planGraphRun(w, {});
    expect(stages.filter((s) => s.state === 'queued').map((s) => s.name)).toEqual(['a', 'b']);
    expect(sinksLeft).toBe(2);
    expect(stages.map((s) => s.sink)).toEqual([null, null, 'one_of', 'one_of']);
  });

  it('the fast path is for a linear successor only', () => {
    const w = wf([
      { tool: a },
      { tool: b },
      { tool: c, after: ['b'] },
      { tool: d, after: ['b'] },
      { name: 'j', tool: a, after: ['c', 'd'] },
    ]);
    expect(linearSuccessor(w, 1)).toBe(2);
    expect(linearSuccessor(w, 2)).toBeNull(); // fan-out
    expect(linearSuccessor(w, 3)).toBeNull(); // into a join
    expect(linearSuccessor(w, 5)).toBeNull(); // the end
  });

  it("every stage copies the workflow concurrency key; the map stage runs in its item tool's class", () => {
    const w = wf([{ tool: a }, { name: 'each', map: { items: () => [], tool: item } }], {
      concurrencyKey: { key: () => 'tenant-1', limit: 2 },
    });
    const { stages } = planGraphRun(w, {});
    expect(stages.map((s) => [s.toolClass, s.concurrencyKey, s.concurrencyLimit])).toEqual([
      ['io', 'tenant-1', 2],
      ['slow', 'tenant-1', 2],
    ]);
  });
});

describe('decideAtClaim', () => {
  const fan = wf([
    { tool: a },
    { tool: b, after: ['a'], when: ({ input }) => (input as { b?: boolean }).b === true },
    { tool: c, after: ['a'], input: ({ results }) => ({ url: (results.a as { text: string }).text }) },
    { name: 'join', tool: d, after: ['b', 'c'], input: ({ results }) => ({ url: JSON.stringify(results) }) },
  ]);

  it('inputs are computed from the persisted results of ancestors only', () => {
    const stages = [row(1, 'a', 'succeeded', { text: 'A' }), row(2, 'b', 'running'), row(3, 'c', 'queued')];
    expect(decideAtClaim({ workflow: fan, runId: RUN, runInput: {}, seq: 3, stages })).toEqual({ kind: 'run', input: { url: 'A' } });
    // A non-ancestor's result never leaks in, whatever its state.
    const node = runGraph(fan).bySeq.get(3)!;
    expect(resultsFor(node, [...stages, row(2, 'b', 'succeeded', { text: 'B' })])).toEqual({ a: { text: 'A' } });
  });

  it('when false: skipped; a mixed join runs with the skipped result absent; all deps skipped: skipped', () => {
    const base = [row(1, 'a', 'succeeded', { text: 'A' })];
    expect(decideAtClaim({ workflow: fan, runId: RUN, runInput: { b: false }, seq: 2, stages: base })).toEqual({
      kind: 'skip',
      reason: 'when_false',
    });
    expect(decideAtClaim({ workflow: fan, runId: RUN, runInput: { b: true }, seq: 2, stages: base })).toEqual({
      kind: 'run',
      input: { b: true },
    });
    const mixed = [...base, row(2, 'b', 'skipped'), row(3, 'c', 'succeeded', { text: 'C' })];
    expect(decideAtClaim({ workflow: fan, runId: RUN, runInput: {}, seq: 4, stages: mixed })).toEqual({
      kind: 'run',
      input: { url: JSON.stringify({ a: { text: 'A' }, c: { text: 'C' } }) },
    });
    const allSkipped = [...base, row(2, 'b', 'skipped'), row(3, 'c', 'skipped')];
    expect(decideAtClaim({ workflow: fan, runId: RUN, runInput: {}, seq: 4, stages: allSkipped })).toEqual({
      kind: 'skip',
      reason: 'deps_skipped',
    });
  });

  it('a skip does not end a sequence: the step after a skipped conditional step runs', () => {
    const seq = wf([{ tool: a }, { tool: b, when: () => false }, { tool: c }]);
    const stages = [row(1, 'a', 'succeeded', { text: 'A' }), row(2, 'b', 'skipped')];
    expect(decideAtClaim({ workflow: seq, runId: RUN, runInput: { x: 1 }, seq: 3, stages })).toEqual({ kind: 'run', input: { x: 1 } });
  });

  it('a failure kept as a value is seen by later steps as { ok: false, error }', () => {
    const w = wf([
      { tool: a, continueOnError: true },
      { tool: b, input: ({ results }) => results },
    ]);
    const stages = [row(1, 'a', 'failed', null, { error: { code: 'boom', message: 'no' } })];
    expect(decideAtClaim({ workflow: w, runId: RUN, runInput: {}, seq: 2, stages })).toEqual({
      kind: 'run',
      input: { a: { ok: false, error: { code: 'boom', message: 'no' } } },
    });
  });

  it('user code that throws fails the stage with a planner code; when must return a boolean', () => {
    const w = wf([
      {
        tool: a,
        input: () => {
          throw new Error('no input');
        },
      },
      { tool: b, after: [], when: () => 'yes' as unknown as boolean },
      {
        tool: c,
        after: [],
        when: () => {
          throw new Error('no');
        },
      },
      { tool: d, after: [], input: () => ({ big: 10n }) },
    ]);
    const q = (seq: number) => decideAtClaim({ workflow: w, runId: RUN, runInput: {}, seq, stages: [] });
    expect(q(1)).toMatchObject({
      kind: 'fail',
      error: { code: 'step_input_failed', kind: 'permanent', message: expect.stringMatching(/no input/) },
    });
    expect(q(2)).toMatchObject({ kind: 'fail', error: { code: 'when_failed', message: expect.stringMatching(/not a boolean/) } });
    expect(q(3)).toMatchObject({ kind: 'fail', error: { code: 'when_failed' } });
    expect(q(4)).toMatchObject({ kind: 'fail', error: { code: 'step_input_failed', message: expect.stringMatching(/not JSON/) } });
  });

  it('a stage claimed before its dependencies ended is a bug, said loudly', () => {
    expect(() =>
      decideAtClaim({ workflow: fan, runId: RUN, runInput: {}, seq: 4, stages: [row(1, 'a', 'succeeded'), row(2, 'b', 'running')] }),
    ).toThrow(/before its dependency 2 ended/);
  });
});

describe('map', () => {
  const mapped = (over: { maxParallel?: number; maxItems?: number; continueOnError?: boolean } = {}) =>
    wf([
      { tool: a },
      {
        name: 'each',
        continueOnError: over.continueOnError,
        map: {
          items: ({ results }) => (results.a as { list: number[] }).list,
          tool: item,
          input: (n: number, i) => ({ n: n * 10 + i }),
          maxParallel: over.maxParallel,
          maxItems: over.maxItems,
        },
      },
      { tool: c, input: ({ results }) => ({ url: JSON.stringify(results.each) }) },
    ]);
  const after = (list: unknown) => [row(1, 'a', 'succeeded', { list })];

  it('expands to one queued stage per item: stable seqs and keys, inputs computed now, maxParallel as a per-run key', () => {
    const d1 = decideAtClaim({ workflow: mapped({ maxParallel: 5 }), runId: RUN, runInput: {}, seq: 2, stages: after([1, 2, 3]) });
    expect(d1.kind).toBe('expand');
    if (d1.kind !== 'expand') return;
    expect(d1.items.map((s) => [s.seq, s.name, s.idempotencyKey, s.input, s.nextSeqs, s.itemIndex, s.groupSeq, s.state])).toEqual([
      [2 * ITEM_SEQ_STRIDE, 'each[0]', `${RUN}:each:0`, { n: 10 }, [2], 0, 2, 'queued'],
      [2 * ITEM_SEQ_STRIDE + 1, 'each[1]', `${RUN}:each:1`, { n: 21 }, [2], 1, 2, 'queued'],
      [2 * ITEM_SEQ_STRIDE + 2, 'each[2]', `${RUN}:each:2`, { n: 32 }, [2], 2, 2, 'queued'],
    ]);
    expect(
      d1.items.every((s) => s.concurrencyKey === `${RUN}:each` && s.concurrencyLimit === 5 && s.toolClass === 'slow' && s.tool === 'item'),
    ).toBe(true);
    // The same persisted results give the same expansion (a retried claim inserts the same rows).
    expect(decideAtClaim({ workflow: mapped({ maxParallel: 5 }), runId: RUN, runInput: {}, seq: 2, stages: after([1, 2, 3]) })).toEqual(d1);
  });

  it('without maxParallel the items carry the workflow key, if any', () => {
    const d1 = decideAtClaim({ workflow: mapped(), runId: RUN, runInput: {}, seq: 2, stages: after([1]) });
    expect(d1.kind === 'expand' && d1.items[0]!.concurrencyKey).toBeUndefined();
  });

  it('an empty list ends the step with []; over the bound: map_too_large; no array: map_items_failed', () => {
    expect(decideAtClaim({ workflow: mapped(), runId: RUN, runInput: {}, seq: 2, stages: after([]) })).toEqual({
      kind: 'done',
      result: [],
    });
    const big = decideAtClaim({ workflow: mapped({ maxItems: 3 }), runId: RUN, runInput: {}, seq: 2, stages: after([1, 2, 3, 4]) });
    expect(big).toMatchObject({ kind: 'fail', error: { code: 'map_too_large', details: { items: 4, maxItems: 3 } } });
    const dflt = decideAtClaim({
      workflow: mapped(),
      runId: RUN,
      runInput: {},
      seq: 2,
      stages: after(Array.from({ length: 10_001 }, (_, i) => i)),
    });
    expect(dflt).toMatchObject({ kind: 'fail', error: { code: 'map_too_large', details: { maxItems: 10_000 } } });
    expect(decideAtClaim({ workflow: mapped(), runId: RUN, runInput: {}, seq: 2, stages: after('x') })).toMatchObject({
      kind: 'fail',
      error: { code: 'map_items_failed', message: expect.stringMatching(/string, not an array/) },
    });
  });

  it('the map stage claimed again gathers its items in item order; an open item: it waits', () => {
    const w = mapped({ continueOnError: true });
    const items = [
      row(2 * ITEM_SEQ_STRIDE + 1, 'each[1]', 'failed', null, { itemIndex: 1, groupSeq: 2, error: { code: 'x' } }),
      row(2 * ITEM_SEQ_STRIDE, 'each[0]', 'succeeded', { text: 'zero' }, { itemIndex: 0, groupSeq: 2 }),
    ];
    const stages = [...after([1, 2]), row(2, 'each', 'running'), ...items];
    expect(decideAtClaim({ workflow: w, runId: RUN, runInput: {}, seq: 2, stages })).toEqual({
      kind: 'done',
      result: [{ text: 'zero' }, { ok: false, error: { code: 'x' } }],
    });
    const open = [...stages.slice(0, 3), { ...items[0]!, state: 'running' }, items[1]!];
    expect(decideAtClaim({ workflow: w, runId: RUN, runInput: {}, seq: 2, stages: open })).toEqual({ kind: 'wait' });
    // The step after the map sees the gathered list by the map's name (items are not results of their own).
    const later = [...after([1, 2]), row(2, 'each', 'succeeded', [{ text: 'zero' }, { text: 'one' }]), ...items];
    expect(decideAtClaim({ workflow: w, runId: RUN, runInput: {}, seq: 3, stages: later })).toEqual({
      kind: 'run',
      input: { url: JSON.stringify([{ text: 'zero' }, { text: 'one' }]) },
    });
  });

  it('an item runs with the input its expansion stored', () => {
    const stages = [row(2 * ITEM_SEQ_STRIDE, 'each[0]', 'running', null, { itemIndex: 0, groupSeq: 2, input: { n: 7 } })];
    expect(decideAtClaim({ workflow: mapped(), runId: RUN, runInput: {}, seq: 2 * ITEM_SEQ_STRIDE, stages })).toEqual({
      kind: 'run',
      input: { n: 7 },
    });
  });
});

describe('child runs', () => {
  const parent = wf([{ tool: a }, { name: 'sub', workflow: 'child', input: ({ results }) => ({ from: results.a }) }]);
  const stages = [row(1, 'a', 'succeeded', { text: 'A' }), row(2, 'sub', 'running')];

  it('starts the child with its input; then takes its result, or fails with its error', () => {
    expect(decideAtClaim({ workflow: parent, runId: RUN, runInput: {}, seq: 2, stages })).toEqual({
      kind: 'start_child',
      workflow: { name: 'child', version: null },
      input: { from: { text: 'A' } },
    });
    const child = { id: 'c1', state: 'succeeded', result: { ok: 1 }, error: null };
    expect(decideAtClaim({ workflow: parent, runId: RUN, runInput: {}, seq: 2, stages, child })).toEqual({
      kind: 'done',
      result: { ok: 1 },
    });
    expect(decideAtClaim({ workflow: parent, runId: RUN, runInput: {}, seq: 2, stages, child: { ...child, state: 'running' } })).toEqual({
      kind: 'wait',
    });
    const failed = decideAtClaim({
      workflow: parent,
      runId: RUN,
      runInput: {},
      seq: 2,
      stages,
      child: { ...child, state: 'failed', error: { code: 'boom', message: 'it broke' } },
    });
    expect(failed).toMatchObject({
      kind: 'fail',
      error: {
        code: 'child_run_failed',
        message: 'child run c1 failed: it broke',
        details: { childRunId: 'c1', childError: { code: 'boom', message: 'it broke' } },
      },
    });
    expect(
      decideAtClaim({ workflow: parent, runId: RUN, runInput: {}, seq: 2, stages, child: { ...child, state: 'cancelled' } }),
    ).toMatchObject({ error: { code: 'child_run_cancelled' } });
  });
});

describe('group failure', () => {
  it('a step fails the run and cancels the rest, unless it (or its map) keeps the failure as a value', () => {
    const w = wf([
      { tool: a },
      { tool: b, after: ['a'], continueOnError: true },
      { tool: c, after: ['a'] },
      { name: 'each', after: ['a'], continueOnError: true, map: { items: () => [], tool: item } },
    ]);
    expect(decideFailure(w, { seq: 2, tool: 'b', groupSeq: null })).toEqual({ kind: 'value' });
    expect(decideFailure(w, { seq: 3, tool: 'c', groupSeq: null })).toEqual({ kind: 'fail_run' });
    expect(decideFailure(w, { seq: 4 * ITEM_SEQ_STRIDE + 3, tool: 'item', groupSeq: 4 })).toEqual({ kind: 'value' });
  });

  it('an agent tells a failed tool to the model up to maxToolErrors; a failed model call fails the run', () => {
    const ag = (over: Record<string, unknown> = {}) =>
      defineAgent({
        name: 'ag',
        input: z.object({}),
        model: { name: 'm', class: io },
        instructions: 'x',
        tools: [a, b],
        maxToolErrors: 2,
        ...over,
      });
    expect(decideFailure(ag(), { seq: 2, tool: 'a', groupSeq: null }, 0)).toEqual({ kind: 'value' });
    expect(decideFailure(ag(), { seq: 2, tool: 'a', groupSeq: null }, 1)).toEqual({ kind: 'value' });
    expect(decideFailure(ag(), { seq: 2, tool: 'a', groupSeq: null }, 2)).toMatchObject({
      kind: 'fail_run',
      error: { code: 'too_many_tool_errors' },
    });
    expect(decideFailure(ag(), { seq: 1, tool: MODEL_STAGE_TOOL, groupSeq: null })).toEqual({ kind: 'fail_run' });
    expect(decideFailure(ag({ onToolError: 'fail' }), { seq: 2, tool: 'a', groupSeq: null })).toEqual({ kind: 'fail_run' });
    const history = [
      { tool: MODEL_STAGE_TOOL, state: 'failed' },
      { tool: 'a', state: 'failed' },
      { tool: 'b', state: 'failed' },
      { tool: 'a', state: 'failed' },
    ];
    expect(failedToolCalls(history)).toBe(3);
    expect(toolErrorsOver(ag().agent!, 3)?.error.code).toBe('too_many_tool_errors');
    expect(toolErrorsOver(ag().agent!, 2)).toBeNull();
  });
});

describe('an agent answer as a graph', () => {
  const ag = (parallelToolCalls = true) =>
    defineAgent({ name: 'ag', input: z.object({}), model: { name: 'm', class: io }, instructions: 'x', tools: [a, b], parallelToolCalls })
      .agent!;
  const actions = [
    { callId: 'c1', tool: a, input: { url: '1' } },
    { callId: 'c2', tool: b, input: { url: '2' } },
    { callId: 'c3', tool: a, input: { url: '3' } },
  ];

  it('three tool calls run in parallel after the model stage; the next model call joins all three', () => {
    const plan = planAgentAnswer(ag(), 4, actions);
    expect(plan.map((s) => [s.seq, s.tool, s.state, s.deps, s.nextSeqs, s.depsLeft, s.continueOnError])).toEqual([
      [5, 'a', 'queued', [4], [8], 0, true],
      [6, 'b', 'queued', [4], [8], 0, true],
      [7, 'a', 'queued', [4], [8], 0, true],
      [8, MODEL_STAGE_TOOL, 'pending', [5, 6, 7], [], 3, false],
    ]);
  });

  it('parallelToolCalls false keeps the chain; an empty list is the next model call, queued', () => {
    const chain = planAgentAnswer(ag(false), 1, actions);
    expect(chain.map((s) => [s.seq, s.state, s.deps, s.nextSeqs, s.depsLeft])).toEqual([
      [2, 'queued', [1], [3], 0],
      [3, 'pending', [2], [4], 1],
      [4, 'pending', [3], [5], 1],
      [5, 'pending', [4], [], 1],
    ]);
    expect(planAgentAnswer(ag(), 3, []).map((s) => [s.seq, s.state, s.depsLeft])).toEqual([[4, 'queued', 0]]);
  });
});

describe('a failed tool call told to the model', () => {
  it("is the error's code and message (the last attempt's when the budget ran out)", async () => {
    const { toolAnswer } = await import('../../src/agent/messages.js');
    expect(toolAnswer({ state: 'succeeded', result: { text: 'x' } })).toBe('{"text":"x"}');
    expect(
      JSON.parse(toolAnswer({ state: 'failed', result: null, error: { code: 'not_found', message: 'no such page', stack: 'at x' } })),
    ).toEqual({ error: 'tool_failed', code: 'not_found', message: 'no such page' });
    expect(
      JSON.parse(
        toolAnswer({
          state: 'failed',
          result: null,
          error: { code: 'attempts_exhausted', lastError: { code: 'http_503', message: 'busy' } },
        }),
      ),
    ).toEqual({ error: 'tool_failed', code: 'http_503', message: 'busy' });
  });
});

describe('an agent stage at its claim', () => {
  const child = defineWorkflow({ name: 'research', input: z.object({ topic: z.string() }), steps: [{ tool: d }] });
  const ag = defineAgent({
    name: 'ag',
    input: z.object({}),
    model: { name: 'm', class: io },
    instructions: 'x',
    maxToolErrors: 1,
    tools: [a, defineWorkflowTool({ workflow: child, description: 'researches' })],
  });
  const st = (seq: number, tool: string, state: string, input: unknown = null) => row(seq, tool, state, null, { tool, input });

  it('a model call past maxToolErrors fails with too_many_tool_errors; under it, it runs', () => {
    const one = [
      st(1, MODEL_STAGE_TOOL, 'succeeded'),
      st(2, 'a', 'failed'),
      st(3, 'a', 'succeeded'),
      st(4, MODEL_STAGE_TOOL, 'running', {}),
    ];
    expect(decideAtClaim({ workflow: ag, runId: RUN, runInput: {}, seq: 4, stages: one })).toEqual({ kind: 'run', input: {} });
    const two = [...one.slice(0, 3), st(4, 'a', 'failed'), st(5, MODEL_STAGE_TOOL, 'running', {})];
    expect(decideAtClaim({ workflow: ag, runId: RUN, runInput: {}, seq: 5, stages: two })).toMatchObject({
      kind: 'fail',
      error: { code: 'too_many_tool_errors', details: { failedToolCalls: 2, maxToolErrors: 1 } },
    });
  });

  it('a workflow tool starts its child with the validated input, then takes its outcome; a tool runs with its stored input', () => {
    const stages = [
      st(1, MODEL_STAGE_TOOL, 'succeeded'),
      st(2, 'research', 'running', { topic: 't' }),
      st(3, 'a', 'running', { url: 'u' }),
    ];
    expect(decideAtClaim({ workflow: ag, runId: RUN, runInput: {}, seq: 2, stages })).toEqual({
      kind: 'start_child',
      workflow: { name: 'research', version: 1 },
      input: { topic: 't' },
    });
    expect(
      decideAtClaim({
        workflow: ag,
        runId: RUN,
        runInput: {},
        seq: 2,
        stages,
        child: { id: 'c', state: 'succeeded', result: 'R', error: null },
      }),
    ).toEqual({ kind: 'done', result: 'R' });
    expect(decideAtClaim({ workflow: ag, runId: RUN, runInput: {}, seq: 3, stages })).toEqual({ kind: 'run', input: { url: 'u' } });
  });
});

describe('settleStage and the fast path input', () => {
  it('maps each decision to the finish the store writes; failures go through the group rule', async () => {
    const { settleStage } = await import('../../src/planner/settle.js');
    const w = wf([{ tool: a }, { tool: b, continueOnError: true }, { tool: c }]);
    const at = (seq: number) => ({ seq, tool: 'x', groupSeq: null });
    expect(settleStage(w, at(1), { kind: 'run', input: {} }, { kind: 'succeeded', output: { text: 'A' } })).toEqual({
      outcome: 'succeeded',
      result: { text: 'A' },
    });
    expect(settleStage(w, at(1), { kind: 'skip', reason: 'when_false' })).toEqual({ outcome: 'skipped', reason: 'when_false' });
    expect(settleStage(w, at(2), { kind: 'run', input: {} }, { kind: 'failed_for_good', error: { code: 'e' } })).toEqual({
      outcome: 'failed',
      error: { code: 'e' },
      asValue: true,
    });
    expect(settleStage(w, at(3), { kind: 'run', input: {} }, { kind: 'failed_for_good', error: { code: 'e' } })).toEqual({
      outcome: 'failed',
      error: { code: 'e' },
      asValue: false,
      runError: { code: 'e' },
    });
    const fail = { kind: 'fail' as const, error: { code: 'map_too_large' as const, message: 'm', kind: 'permanent' as const } };
    expect(settleStage(w, at(1), fail)).toMatchObject({ outcome: 'failed', asValue: false, runError: { code: 'map_too_large' } });
    expect(settleStage(w, at(1), { kind: 'expand', items: [] })).toEqual({ outcome: 'waiting', waitFor: 0, plan: [] });
    expect(settleStage(w, at(1), { kind: 'start_child', workflow: { name: 'x', version: null }, input: 1 })).toEqual({
      outcome: 'waiting',
      startChild: { workflow: { name: 'x', version: null }, input: 1 },
    });
    expect(settleStage(w, at(1), { kind: 'wait' })).toEqual({ outcome: 'hand_back' });
  });

  it("the fast path computes a linear successor's input with the fresh result; not for a fan-out or a conditional successor", async () => {
    const { fastPathInput } = await import('../../src/planner/settle.js');
    const lin = wf([{ tool: a }, { tool: b, input: ({ results }) => ({ url: (results.a as { text: string }).text }) }]);
    const q = { runId: RUN, runInput: {}, seq: 1, stages: [row(1, 'a', 'running')] };
    expect(fastPathInput(lin, q, { text: 'fresh' })).toEqual({ seq: 2, input: { url: 'fresh' } });
    const cond = wf([{ tool: a }, { tool: b, when: () => false }]);
    expect(fastPathInput(cond, q, { text: 'x' })).toBeNull();
    const fan = wf([{ tool: a }, { tool: b, after: ['a'] }, { tool: c, after: ['a'] }]);
    expect(fastPathInput(fan, q, { text: 'x' })).toBeNull();
  });
});
