import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { InvalidDefinitionError } from '../../src/errors.js';
import { defineAgent } from '../../src/definitions/agent.js';
import {
  defineTool,
  defineToolClass,
  defineWorkflow,
  DEFAULT_AGENT_SLEEP_MAX_MS,
  MAX_WAIT_MS,
  SIGNAL_TOOL,
  SLEEP_TOOL,
} from '../../src/definitions/index.js';
import { makeClass, makeTool } from './fixtures.js';

const io = makeClass();
const fetchDoc = makeTool('fetch_doc', io);
const input = z.object({ at: z.string().optional() });
const model = defineToolClass({ name: 'model', lease: '90s', heartbeat: '30s', timeout: '60s', maxDuration: '10m' });

/** The error a definition throws, for its path and message. */
function refusal(fn: () => unknown): InvalidDefinitionError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(InvalidDefinitionError);
    return err as InvalidDefinitionError;
  }
  throw new Error('expected an InvalidDefinitionError');
}

const gated = (over: Record<string, unknown> = {}) =>
  defineTool({
    name: 'create_case',
    description: 'files a case',
    class: io,
    input: z.object({ invoiceId: z.string(), amount: z.number() }),
    output: z.object({ caseId: z.string() }),
    run: async () => ({ caseId: 'c' }),
    ...over,
  });

describe('sleep steps', () => {
  it('sleep: a duration (ms string or ms, up to 366 days: a wait is timed by the database, not setTimeout); until: a function', () => {
    const w = defineWorkflow({
      name: 'napper',
      input,
      steps: [{ tool: fetchDoc }, { sleep: '10m' }, { name: 'late', until: () => new Date() }],
    });
    expect(w.steps[1]).toMatchObject({ name: 'sleep', kind: 'sleep', tool: SLEEP_TOOL, sleep: { ms: 600_000 } });
    expect(w.steps[2]!.kind).toBe('sleep');
    expect(w.steps[2]!.sleep!.ms).toBeNull();
    expect(typeof w.steps[2]!.sleep!.until).toBe('function');
    expect(defineWorkflow({ name: 'week', input, steps: [{ sleep: '30d' }] }).steps[0]!.sleep!.ms).toBe(30 * 86_400_000);
    expect(defineWorkflow({ name: 'max', input, steps: [{ sleep: MAX_WAIT_MS }] }).steps[0]!.sleep!.ms).toBe(MAX_WAIT_MS);
  });

  it('refuses, with the path: no duration or function, both, a bad duration, zero, more than 366 days, a bad until', () => {
    expect(
      refusal(() => defineWorkflow({ name: 'w', input, steps: [{ tool: fetchDoc }, { sleep: '10m', until: () => new Date() } as never] }))
        .path,
    ).toBe('workflow[w].steps[1].sleep');
    expect(refusal(() => defineWorkflow({ name: 'w', input, steps: [{ sleep: 'soon' }] })).path).toBe('workflow[w].steps[0].sleep');
    expect(refusal(() => defineWorkflow({ name: 'w', input, steps: [{ sleep: 0 }] })).message).toMatch(/greater than 0/);
    expect(refusal(() => defineWorkflow({ name: 'w', input, steps: [{ sleep: '400d' }] })).message).toMatch(/longest wait/);
    expect(refusal(() => defineWorkflow({ name: 'w', input, steps: [{ until: '2030-01-01' as never }] })).path).toBe(
      'workflow[w].steps[0].until',
    );
    expect(refusal(() => defineWorkflow({ name: 'w', input, steps: [{ sleep: '1m', tool: fetchDoc } as never] })).path).toMatch(
      /steps\[0\]/,
    );
    // Two sleeps need names (the default name is "sleep").
    expect(refusal(() => defineWorkflow({ name: 'w', input, steps: [{ sleep: '1m' }, { sleep: '2m' }] })).path).toBe(
      'workflow[w].steps[1].name',
    );
    expect(defineWorkflow({ name: 'w', input, steps: [{ sleep: '1m' }, { name: 'again', sleep: '2m' }] }).steps).toHaveLength(2);
  });
});

describe('signal steps', () => {
  const approved = z.object({ approved: z.boolean(), by: z.string() });
  it('waitForSignal: name (default step name), schema, timeout, onTimeout', () => {
    const w = defineWorkflow({
      name: 'hooked',
      input,
      steps: [
        { tool: fetchDoc },
        {
          waitForSignal: {
            name: 'payment_cleared',
            schema: approved,
            timeout: '2d',
            onTimeout: () => ({ approved: false, by: 'timeout' }),
          },
        },
      ],
    });
    const s = w.steps[1]!;
    expect(s).toMatchObject({
      name: 'payment_cleared',
      kind: 'signal',
      tool: SIGNAL_TOOL,
      signal: { name: 'payment_cleared', timeoutMs: 172_800_000 },
    });
    expect(s.signal!.schema).toBe(approved);
    expect(typeof s.signal!.onTimeout).toBe('function');
    expect(w.graph).toBe(true); // not runnable until phase 2 (refused at submit like every graph workflow)
  });

  it('refuses, with the path: a bad name, a missing schema or timeout, a non-JSON schema, a non-function onTimeout, one signal name twice', () => {
    const step = (w: Record<string, unknown>) => defineWorkflow({ name: 'w', input, steps: [{ waitForSignal: w as never }] });
    expect(refusal(() => step({ name: 'has space', schema: approved, timeout: '1h' })).path).toBe(
      'workflow[w].steps[0].waitForSignal.name',
    );
    expect(refusal(() => step({ name: 'ok', timeout: '1h' })).path).toBe('workflow[w].steps[0].waitForSignal.schema');
    expect(refusal(() => step({ name: 'ok', schema: approved })).path).toBe('workflow[w].steps[0].waitForSignal.timeout');
    expect(refusal(() => step({ name: 'ok', schema: approved, timeout: '1h', onTimeout: 'fail' })).path).toBe(
      'workflow[w].steps[0].waitForSignal.onTimeout',
    );
    expect(refusal(() => step({ name: 'ok', schema: approved, timeout: '1h', extra: 1 })).path).toMatch(/waitForSignal/);
    expect(refusal(() => step({ name: 'ok', schema: z.object({ at: z.date() }), timeout: '1h' })).path).toBe(
      'workflow[w].steps[0].waitForSignal.schema',
    );
    const twice = refusal(() =>
      defineWorkflow({
        name: 'w',
        input,
        steps: [
          { name: 'first', waitForSignal: { name: 'go', schema: approved, timeout: '1h' } },
          { name: 'second', waitForSignal: { name: 'go', schema: approved, timeout: '1h' } },
        ],
      }),
    );
    expect(twice.path).toBe('workflow[w].steps[1].waitForSignal.name');
  });
});

describe('approval gates on tools', () => {
  it('approval: true or a function, approvalTimeout (a wait duration)', () => {
    expect(gated({ approval: true }).approval).toEqual({ when: true, timeoutMs: null });
    const when = (i: { amount: number }) => i.amount > 100;
    const t = gated({ approval: when, approvalTimeout: '2d' });
    expect(t.approval!.when).toBe(when);
    expect(t.approval!.timeoutMs).toBe(172_800_000);
    expect(gated().approval).toBeUndefined();
  });

  it('refuses, with the path: approval false or a string, approvalTimeout without approval, a bad approvalTimeout', () => {
    expect(refusal(() => gated({ approval: false })).path).toBe('tool[create_case].approval');
    expect(refusal(() => gated({ approval: 'yes' })).path).toBe('tool[create_case].approval');
    expect(refusal(() => gated({ approvalTimeout: '1h' })).path).toBe('tool[create_case].approvalTimeout');
    expect(refusal(() => gated({ approval: true, approvalTimeout: '-1s' })).path).toBe('tool[create_case].approvalTimeout');
  });
});

describe('agent sleep', () => {
  const agent = (over: Record<string, unknown> = {}, tools = [fetchDoc]) =>
    defineAgent({ name: 'sleeper', input, model: { name: 'm', class: model }, instructions: 'x', tools, ...over });
  it('allowSleep: true (7 days), { max }, default not offered; a tool named "sleep" clashes', () => {
    expect(agent().agent!.sleep).toBeNull();
    expect(agent({ allowSleep: true }).agent!.sleep).toEqual({ maxMs: DEFAULT_AGENT_SLEEP_MAX_MS });
    expect(agent({ allowSleep: { max: '1h' } }).agent!.sleep).toEqual({ maxMs: 3_600_000 });
    expect(agent({ allowSleep: false }).agent!.sleep).toBeNull();
    expect(refusal(() => agent({ allowSleep: { max: 'never' } })).path).toMatch(/^agent\[sleeper\].allowSleep/);
    expect(refusal(() => agent({ allowSleep: true }, [fetchDoc, makeTool('sleep', io)])).path).toBe('agent[sleeper].tools[1]');
    expect(agent({}, [fetchDoc, makeTool('sleep', io)]).agent!.sleep).toBeNull(); // without allowSleep a tool may be called sleep
  });
});

describe('fingerprints', () => {
  it('hashes that do not use waits stay what they were (the pinned hashes of versions.test.ts)', () => {
    expect(defineWorkflow({ name: 'stable', input: z.object({}), steps: [{ tool: makeTool('fetch_doc', io) }] }).hash).toBe(
      'bc888e90033ce370d8fad45e61c0ae05f4d1f92e69dcca2e24665e4a00dd43e3',
    );
    const plain = defineAgent({
      name: 'stable_agent',
      input: z.object({}),
      model: { name: 'm', class: model },
      instructions: 'x',
      tools: [fetchDoc],
    });
    expect(plain.hash).toBe('cec304e5d3b60ab82258aabab4cf2d6a4d009abc0313424f13ca734a207b5d9b');
    expect(
      defineAgent({
        name: 'stable_agent',
        input: z.object({}),
        model: { name: 'm', class: model },
        instructions: 'x',
        tools: [fetchDoc],
        allowSleep: false,
      }).hash,
    ).toBe(plain.hash);
  });

  it('the hash covers sleep, signal and approval settings', () => {
    const sleepy = (sleep: string) => defineWorkflow({ name: 'w', input, steps: [{ tool: fetchDoc }, { sleep }] }).hash;
    expect(sleepy('10m')).not.toBe(sleepy('11m'));
    expect(sleepy('10m')).toBe(sleepy('600s'));
    const untilHash = defineWorkflow({ name: 'w', input, steps: [{ tool: fetchDoc }, { name: 'sleep', until: () => new Date() }] }).hash;
    expect(untilHash).not.toBe(sleepy('10m'));
    const sig = (schema: z.ZodType, timeout: string, onTimeout?: () => unknown) =>
      defineWorkflow({ name: 'w', input, steps: [{ waitForSignal: { name: 'go', schema, timeout, ...(onTimeout ? { onTimeout } : {}) } }] })
        .hash;
    const base = sig(z.object({ a: z.string() }), '1h');
    expect(sig(z.object({ a: z.number() }), '1h')).not.toBe(base);
    expect(sig(z.object({ a: z.string() }), '2h')).not.toBe(base);
    expect(sig(z.object({ a: z.string() }), '1h', () => 1)).not.toBe(base);
    expect(sig(z.object({ a: z.string() }), '60m')).toBe(base);
    const withTool = (t: ReturnType<typeof gated>) => defineWorkflow({ name: 'w', input, steps: [{ tool: t, input: () => ({}) }] }).hash;
    const none = withTool(gated());
    const always = withTool(gated({ approval: true }));
    expect(always).not.toBe(none);
    expect(withTool(gated({ approval: () => true }))).not.toBe(always);
    expect(withTool(gated({ approval: true, approvalTimeout: '1d' }))).not.toBe(always);
    const ag = (allowSleep?: unknown) =>
      defineAgent({
        name: 'a',
        input,
        model: { name: 'm', class: model },
        instructions: 'x',
        tools: [fetchDoc],
        ...(allowSleep !== undefined ? { allowSleep } : {}),
      } as never).hash;
    expect(ag(true)).not.toBe(ag());
    expect(ag({ max: '1h' })).not.toBe(ag(true));
  });
});
