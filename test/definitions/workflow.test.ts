import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { InvalidDefinitionError } from '../../src/errors.js';
import { defineWorkflow, type WorkflowOptions } from '../../src/definitions/index.js';
import { makeClass, makeTool } from './fixtures.js';

function refusal(options: unknown): InvalidDefinitionError {
  try {
    defineWorkflow(options as WorkflowOptions<unknown>);
  } catch (err) {
    expect(err).toBeInstanceOf(InvalidDefinitionError);
    return err as InvalidDefinitionError;
  }
  throw new Error('expected the workflow to be refused');
}

/** Builds the same definition from scratch each time: new classes, tools and schemas. */
function build(over: { lease?: string; extraStep?: boolean; name?: string; stepInput?: boolean; outputField?: string } = {}) {
  const io = makeClass({ lease: over.lease ?? '90s' });
  const fetchDoc = makeTool('fetch_doc', io);
  const summarise = makeTool('summarise', io, { output: z.object({ [over.outputField ?? 'text']: z.string() }) });
  const publish = makeTool('publish', io);
  return defineWorkflow({
    name: over.name ?? 'summarise',
    input: z.object({ url: z.string() }),
    steps: [
      { tool: fetchDoc },
      { tool: summarise, ...(over.stepInput === false ? {} : { input: ({ results }) => results.fetch_doc }) },
      ...(over.extraStep ? [{ tool: publish }] : []),
    ],
  });
}

describe('defineWorkflow', () => {
  it('makes a frozen workflow; step names default to the tool name', () => {
    const wf = build({ extraStep: true });
    expect(wf.kind).toBe('workflow');
    expect(wf.steps.map((s) => s.name)).toEqual(['fetch_doc', 'summarise', 'publish']);
    expect(typeof wf.steps[1]?.input).toBe('function');
    expect(wf.steps[0] && 'input' in wf.steps[0]).toBe(false);
    expect(wf.deadlineMs).toBeNull();
    expect(Object.isFrozen(wf) && Object.isFrozen(wf.steps) && Object.isFrozen(wf.steps[0])).toBe(true);
  });

  it('resolves a deadline', () => {
    const tool = makeTool('t');
    expect(defineWorkflow({ name: 'w', input: z.object({}), steps: [{ tool }], deadline: '1h' }).deadlineMs).toBe(3_600_000);
    expect(refusal({ name: 'w', input: z.object({}), steps: [{ tool }], deadline: -5 }).path).toBe('workflow[w].deadline');
  });

  it('accepts a tool used twice under explicit names', () => {
    const tool = makeTool('t');
    const wf = defineWorkflow({
      name: 'w',
      input: z.object({}),
      steps: [
        { tool, name: 'first' },
        { tool, name: 'second' },
      ],
    });
    expect(wf.steps.map((s) => s.name)).toEqual(['first', 'second']);
  });

  describe('hash', () => {
    it('is a sha256 hex, stable across two identical definitions', () => {
      const a = build();
      const b = build();
      expect(a.hash).toMatch(/^[0-9a-f]{64}$/);
      expect(b.hash).toBe(a.hash);
      expect(a.steps[0]?.tool).not.toBe(b.steps[0]?.tool);
    });

    it('ignores function bodies', () => {
      const tool = makeTool('t');
      const one = defineWorkflow({ name: 'w', input: z.object({}), steps: [{ tool, input: () => 1 }] });
      const two = defineWorkflow({ name: 'w', input: z.object({}), steps: [{ tool, input: ({ input }) => input }] });
      expect(two.hash).toBe(one.hash);
    });

    it('changes when a step is added', () => expect(build({ extraStep: true }).hash).not.toBe(build().hash));
    it('changes when a class lease changes', () => expect(build({ lease: '91s' }).hash).not.toBe(build().hash));
    it('changes when the workflow name changes', () => expect(build({ name: 'other' }).hash).not.toBe(build().hash));
    it('changes when a step loses its input function', () => expect(build({ stepInput: false }).hash).not.toBe(build().hash));
    it('changes when a tool output schema changes', () => expect(build({ outputField: 'summary' }).hash).not.toBe(build().hash));

    it('changes with a tool retry override', () => {
      const io = makeClass();
      const plain = makeTool('t', io);
      const wf = (tool: typeof plain) => defineWorkflow({ name: 'w', input: z.object({}), steps: [{ tool }] });
      const h1 = wf(plain).hash;
      const h2 = wf(makeTool('t', makeClass({ retry: { maxAttempts: 9 } }))).hash;
      expect(h2).not.toBe(h1);
    });

    it('copes with schemas JSON Schema cannot express (a stable description instead)', () => {
      const mk = () => makeTool('t', makeClass(), { input: z.object({ when: z.date(), n: z.string().transform(Number) }) });
      const wf = (tool: ReturnType<typeof mk>) => defineWorkflow({ name: 'w', input: z.object({}), steps: [{ tool }] });
      expect(wf(mk()).hash).toBe(wf(mk()).hash);
      const other = makeTool('t', makeClass(), { input: z.object({ when: z.bigint(), n: z.string().transform(Number) }) });
      expect(wf(other).hash).not.toBe(wf(mk()).hash);
    });
  });

  describe('refusals', () => {
    it('refuses no steps', () => {
      expect(refusal({ name: 'w', input: z.object({}), steps: [] }).message).toMatch(/at least one step/);
    });

    it('refuses duplicate step names', () => {
      const tool = makeTool('t');
      const err = refusal({ name: 'w', input: z.object({}), steps: [{ tool }, { tool }] });
      expect(err.message).toMatch(/step name "t" is used by steps\[0\] and steps\[1\].*explicit name/);
      expect(err.path).toBe('workflow[w].steps[1].name');
      const other = makeTool('u');
      expect(
        refusal({
          name: 'w',
          input: z.object({}),
          steps: [
            { tool, name: 'x' },
            { tool: other, name: 'x' },
          ],
        }).message,
      ).toMatch(/"x"/);
    });

    it('refuses two different tools sharing one name', () => {
      const io = makeClass();
      const err = refusal({
        name: 'w',
        input: z.object({}),
        steps: [
          { tool: makeTool('t', io), name: 'a' },
          { tool: makeTool('t', io), name: 'b' },
        ],
      });
      expect(err.message).toMatch(/two different tools are named "t"/);
    });

    it('refuses two different classes sharing one name', () => {
      const err = refusal({
        name: 'w',
        input: z.object({}),
        steps: [{ tool: makeTool('a', makeClass()) }, { tool: makeTool('b', makeClass()) }],
      });
      expect(err.message).toMatch(/two different tool classes are named "io"/);
    });

    it('refuses a step whose tool is not a Tool', () => {
      const tool = makeTool('t');
      expect(refusal({ name: 'w', input: z.object({}), steps: [{ tool: { ...tool } }] }).message).toMatch(/not a tool/);
      expect(refusal({ name: 'w', input: z.object({}), steps: [{ tool: 'fetch_doc' }] }).path).toBe('workflow[w].steps[0].tool');
    });

    it('refuses unknown keys, a non-zod input, bad names and a non-function step input', () => {
      const tool = makeTool('t');
      expect(refusal({ name: 'w', input: z.object({}), steps: [{ tool }], retries: 3 }).message).toMatch(/Unrecognized key.*retries/);
      expect(refusal({ name: 'w', input: z.object({}), steps: [{ tool, later: 'x' }] }).path).toBe('workflow[w].steps[0]');
      expect(refusal({ name: 'w', input: z.object({}), steps: [{ tool, after: 'x' }] }).path).toBe('workflow[w].steps[0].after');
      expect(refusal({ name: 'w', input: {}, steps: [{ tool }] }).path).toBe('workflow[w].input');
      expect(refusal({ name: 'a b', input: z.object({}), steps: [{ tool }] }).message).toMatch(/must be a letter/);
      expect(refusal({ name: 'w', input: z.object({}), steps: [{ tool, name: 'a.b' }] }).path).toBe('workflow[w].steps[0].name');
      expect(refusal({ name: 'w', input: z.object({}), steps: [{ tool, input: { url: 'x' } }] }).message).toMatch(/must be a function/);
    });
  });
});
