import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { InvalidDefinitionError } from '../../src/errors.js';
import {
  CHILD_RUN_TOOL,
  createRegistry,
  defineWorkflow,
  MAP_DEFAULT_MAX_ITEMS,
  type StepOptions,
  type WorkflowOptions,
} from '../../src/definitions/index.js';
import { planStaticRun } from '../../src/planner/plan.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineWorkflowTool } from '../../src/definitions/workflow-tool.js';
import { makeClass, makeTool } from './fixtures.js';

const io = makeClass();
const a = makeTool('a', io);
const b = makeTool('b', io);
const c = makeTool('c', io);
const d = makeTool('d', io);

const wf = (steps: StepOptions[], over: Partial<WorkflowOptions<unknown>> = {}) =>
  defineWorkflow({ name: 'g', input: z.object({}).passthrough(), steps, ...over });

function refusal(make: () => unknown): InvalidDefinitionError {
  try {
    make();
  } catch (err) {
    expect(err).toBeInstanceOf(InvalidDefinitionError);
    return err as InvalidDefinitionError;
  }
  throw new Error('expected the definition to be refused');
}

describe('the run graph in definitions', () => {
  it('a sequence stays a sequence: each step after the previous one, same hash as before the graph', () => {
    const w = wf([{ tool: a }, { tool: b }, { tool: c }]);
    expect(w.graph).toBe(false);
    expect(w.steps.map((s) => s.after)).toEqual([[], ['a'], ['b']]);
    expect(w.steps.map((s) => s.kind)).toEqual(['tool', 'tool', 'tool']);
    // The hash of a plain sequence is the one recorded before the graph existed (pinned in workflow.test.ts too).
    expect(w.hash).toBe(wf([{ tool: a }, { tool: b }, { tool: c }]).hash);
  });

  it('fan-out and join: after names the steps waited for; [] starts with the run', () => {
    const w = wf([{ tool: a }, { tool: b, after: ['a'] }, { tool: c, after: ['a'] }, { tool: d, after: ['b', 'c'] }]);
    expect(w.graph).toBe(true);
    expect(w.steps.map((s) => s.after)).toEqual([[], ['a'], ['a'], ['b', 'c']]);
    const roots = wf([{ tool: a }, { tool: b, after: [] }, { tool: c, after: ['a', 'b'] }]);
    expect(roots.steps.map((s) => s.after)).toEqual([[], [], ['a', 'b']]);
  });

  it('a step after a conditional one also waits for what that one waits for (a skip does not end the sequence)', () => {
    const w = wf([{ tool: a }, { tool: b, when: () => false }, { tool: c, when: () => true }, { tool: d }]);
    expect(w.steps.map((s) => s.after)).toEqual([[], ['a'], ['b', 'a'], ['c', 'b', 'a']]);
    expect(typeof w.steps[1]!.when).toBe('function');
  });

  it('the graph is part of the hash', () => {
    const fan = wf([{ tool: a }, { tool: b, after: ['a'] }, { tool: c, after: ['a'] }]);
    const seq = wf([{ tool: a }, { tool: b }, { tool: c, after: ['b'] }]);
    expect(fan.hash).not.toBe(seq.hash);
    expect(wf([{ tool: a }, { tool: b, continueOnError: true }]).hash).not.toBe(
      wf([{ tool: a }, { tool: b, continueOnError: false }]).hash,
    );
  });

  it('refuses an after that names no step, with the path', () => {
    const e = refusal(() => wf([{ tool: a }, { tool: b, after: ['a', 'nope'] }]));
    expect(e.path).toBe('workflow[g].steps[1].after[1]');
    expect(e.message).toMatch(/"nope", which is no step/);
    expect(e.details.unknown).toBe('nope');
  });

  it('refuses a step waiting for itself, or for one step twice', () => {
    expect(refusal(() => wf([{ tool: a }, { tool: b, after: ['b'] }])).path).toBe('workflow[g].steps[1].after[0]');
    expect(refusal(() => wf([{ tool: a }, { tool: b, after: ['a', 'a'] }])).path).toBe('workflow[g].steps[1].after[1]');
  });

  it('refuses a cycle, naming its path', () => {
    const e = refusal(() => wf([{ tool: a }, { tool: b, after: ['a', 'd'] }, { tool: c, after: ['b'] }, { tool: d, after: ['c'] }]));
    expect(e.message).toMatch(/cycle: b -> c -> d -> b/);
    expect(e.details.cycle).toEqual(['b', 'c', 'd', 'b']);
    expect(e.path).toBe('workflow[g].steps[1].after');
  });

  it('refuses a step that no start leads to (every step waits for another)', () => {
    const e = refusal(() =>
      wf([
        { tool: a, after: ['b'] },
        { tool: b, after: ['a'] },
      ]),
    );
    expect(e.message).toMatch(/cycle: a -> b -> a|cycle: b -> a -> b/);
  });

  it('a map step: items, tool, optional input, maxParallel, maxItems (default 10,000)', () => {
    const w = wf([{ tool: a }, { name: 'each', map: { items: () => [1, 2], tool: b, maxParallel: 5 } }, { tool: c }]);
    const m = w.steps[1]!;
    expect(m.kind).toBe('map');
    expect(m.tool).toBe(b);
    expect(m.map).toMatchObject({ maxParallel: 5, maxItems: MAP_DEFAULT_MAX_ITEMS });
    expect(w.steps[2]!.after).toEqual(['each']);
    expect(wf([{ map: { items: () => [], tool: b } }]).steps[0]!.name).toBe('b');
  });

  it('refuses a map without items, a bad bound, and maxParallel with a workflow concurrency key', () => {
    expect(refusal(() => wf([{ map: { tool: b } } as unknown as StepOptions])).path).toBe('workflow[g].steps[0].map.items');
    expect(refusal(() => wf([{ map: { items: () => [], tool: b, maxParallel: 0 } }])).path).toBe('workflow[g].steps[0].map.maxParallel');
    expect(refusal(() => wf([{ map: { items: () => [], tool: b, maxItems: 1_000_000 } }])).path).toBe('workflow[g].steps[0].map.maxItems');
    expect(refusal(() => wf([{ map: { items: [1, 2], tool: b } } as unknown as StepOptions])).path).toBe('workflow[g].steps[0].map.items');
    const e = refusal(() => wf([{ map: { items: () => [], tool: b, maxParallel: 2 } }], { concurrencyKey: { key: () => 'k', limit: 1 } }));
    expect(e.path).toBe('workflow[g].steps[0].map.maxParallel');
  });

  it('a child-run step: by name or by definition; its stage runs the built-in child-run tool', () => {
    const child = defineWorkflow({ name: 'child', input: z.object({}), steps: [{ tool: d }] });
    const w = wf([{ tool: a }, { workflow: 'child', input: () => ({}) }, { name: 'pinned', workflow: child }]);
    expect(w.steps[1]).toMatchObject({ kind: 'workflow', name: 'child', workflow: { name: 'child', version: null } });
    expect(w.steps[1]!.tool).toBe(CHILD_RUN_TOOL);
    expect(w.steps[2]!.workflow).toEqual({ name: 'child', version: 1 });
    expect(refusal(() => wf([{ workflow: child, version: 2 }])).path).toBe('workflow[g].steps[0].version');
    expect(refusal(() => wf([{ workflow: 'a b' }])).path).toBe('workflow[g].steps[0].workflow');
  });

  it('the registry refuses a child workflow it has not loaded, and child runs that start each other', () => {
    const child = defineWorkflow({ name: 'child', input: z.object({}), steps: [{ tool: d }] });
    const parent = wf([{ tool: a }, { workflow: 'child' }]);
    expect(createRegistry([parent, child]).get('g')).toBe(parent);
    const missing = refusal(() => createRegistry([parent]));
    expect(missing.path).toBe('workflows[0].steps[1].workflow');
    expect(missing.message).toMatch(/child workflow "child", which is not loaded/);
    expect(refusal(() => createRegistry([wf([{ workflow: 'child', version: 3 }]), child])).message).toMatch(/version 3 of "child"/);
    const x = defineWorkflow({ name: 'x', input: z.object({}), steps: [{ tool: a }, { workflow: 'y' }] });
    const y = defineWorkflow({ name: 'y', input: z.object({}), steps: [{ workflow: 'x' }] });
    const cycle = refusal(() => createRegistry([x, y]));
    expect(cycle.details.cycle).toEqual(['x', 'y', 'x']);
  });

  it("a step kind is chosen by its key; errors name that kind's fields", () => {
    expect(refusal(() => wf([{ tool: a, map: 3 } as unknown as StepOptions])).path).toMatch(/^workflow\[g\]\.steps\[0\]/);
    expect(refusal(() => wf([{ tool: a, when: true } as unknown as StepOptions])).path).toBe('workflow[g].steps[0].when');
    expect(refusal(() => wf([{ tool: a, continueOnError: 'yes' } as unknown as StepOptions])).path).toBe(
      'workflow[g].steps[0].continueOnError',
    );
  });

  it('a graph workflow is planned as its graph (a sequence as a chain); child steps are refused at submit for now', () => {
    const fan = planStaticRun(wf([{ tool: a }, { tool: b, after: [] }]), {});
    expect(fan.sinksLeft).toBe(2);
    expect(fan.stages.map((s) => [s.deps, s.nextSeqs, s.sink])).toEqual([
      [[], [], 'one_of'],
      [[], [], 'one_of'],
    ]);
    const seq = planStaticRun(wf([{ tool: a }, { tool: b }]), {});
    expect(seq.stages.map((s) => [s.deps, s.nextSeqs, s.sink])).toEqual([
      [[], [2], null],
      [[1], [], 'only'],
    ]);
    expect(planStaticRun(wf([{ tool: a }, { name: 'm', map: { items: () => [], tool: b } }]), {}).sinksLeft).toBe(1);
  });
});

describe('agent options for tool calls', () => {
  const model = { name: 'm', class: io };
  const agent = (over: Record<string, unknown> = {}) =>
    defineAgent({ name: 'ag', input: z.object({}), model, instructions: 'x', tools: [a, b], ...over });

  it('defaults: parallel tool calls, a failed tool told to the model, at most 5 tool errors; defaults keep the old hash', () => {
    const x = agent();
    expect(x.agent).toMatchObject({ parallelToolCalls: true, onToolError: 'tell_model', maxToolErrors: 5 });
    expect(agent({ parallelToolCalls: true, onToolError: 'tell_model', maxToolErrors: 5 }).hash).toBe(x.hash);
    expect(agent({ onToolError: 'fail' }).hash).not.toBe(x.hash);
    expect(agent({ parallelToolCalls: false }).hash).not.toBe(x.hash);
    expect(agent({ maxToolErrors: 1 }).hash).not.toBe(x.hash);
  });

  it('refuses bad values with the path', () => {
    expect(refusal(() => agent({ onToolError: 'ignore' })).path).toBe('agent[ag].onToolError');
    expect(refusal(() => agent({ maxToolErrors: -1 })).path).toBe('agent[ag].maxToolErrors');
  });
});

describe('a workflow offered to an agent as a tool (a child run)', () => {
  const child = defineWorkflow({ name: 'research', input: z.object({ topic: z.string() }), steps: [{ tool: d }] });
  const model = { name: 'm', class: io };
  const agent = (tools: ReturnType<typeof defineWorkflowTool>[]) =>
    defineAgent({ name: 'boss', input: z.object({}), model, instructions: 'x', tools: [a, ...tools] });

  it("takes the workflow's input schema (or its own), runs in $control, and is part of the agent's hash", () => {
    const t = defineWorkflowTool({ workflow: child, description: 'researches a topic' });
    expect(t).toMatchObject({ name: 'research', childWorkflow: { name: 'research', version: 1 }, class: { name: '$control' } });
    expect(t.input.safeParse({ topic: 'x' }).success).toBe(true);
    expect(t.input.safeParse({}).success).toBe(false);
    const named = defineWorkflowTool({
      workflow: 'research',
      name: 'ask_research',
      description: 'd',
      input: z.object({ topic: z.string() }),
    });
    expect(named.childWorkflow).toEqual({ name: 'research', version: null });
    expect(agent([t]).hash).not.toBe(agent([named]).hash);
    expect(agent([]).hash).toBe(agent([]).hash);
  });

  it('refuses a name without input, a version with a definition, a bad description', () => {
    expect(refusal(() => defineWorkflowTool({ workflow: 'research', description: 'd' })).path).toBe('workflowTool[research].input');
    expect(refusal(() => defineWorkflowTool({ workflow: child, version: 2, description: 'd' })).path).toBe(
      'workflowTool[research].version',
    );
    expect(refusal(() => defineWorkflowTool({ workflow: child, description: '' })).path).toBe('workflowTool[research].description');
  });

  it('the registry checks the workflow is loaded', () => {
    const boss = agent([defineWorkflowTool({ workflow: child, description: 'd' })]);
    expect(createRegistry([boss, child]).get('boss')).toBe(boss);
    expect(refusal(() => createRegistry([boss])).path).toBe('workflows[0].tools[1]');
  });
});

describe('the example (workflows/research-digest.ts)', () => {
  it('loads: fan-out of three, a join, a map bounded to 3, a merge and a child run; the child is loaded beside it', async () => {
    const { researchDigest, publishDigest } = await import('../../workflows/research-digest.js');
    const r = createRegistry([researchDigest, publishDigest]);
    const w = r.require('research-digest');
    expect(w.steps.map((s) => [s.name, s.kind, s.after])).toEqual([
      ['search_news', 'tool', []],
      ['search_papers', 'tool', []],
      ['search_forums', 'tool', []],
      ['pick_articles', 'tool', ['search_news', 'search_papers', 'search_forums']],
      ['summaries', 'map', ['pick_articles']],
      ['merge', 'tool', ['summaries']],
      ['publish', 'workflow', ['merge']],
    ]);
    expect(w.steps[4]!.map!.maxParallel).toBe(3);
    expect(r.toolClasses().map((c) => c.name)).toEqual(['$control', 'digest-io']);
  });
});
