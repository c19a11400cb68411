import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startScriptedModel, type ScriptedAnswer, type ScriptedModel } from '../../src/agent/scripted-model.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { PermanentError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * Agents as a run graph (issue 11) on PostgreSQL with a scripted model: the tool calls of one
 * answer run as parallel stages (their running intervals overlap) and the next model call waits
 * for all of them and sees the three results; a tool that fails for good is told to the model
 * (onToolError 'tell_model', the default), which recovers; more than maxToolErrors failures end
 * the run with too_many_tool_errors.
 */
const llm = defineToolClass({
  name: 'pt_llm',
  lease: '5s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '4s',
  maxDuration: '30s',
  retry: { maxAttempts: 2, backoff: { initial: '50ms' } },
});
const io = defineToolClass({
  name: 'pt_io',
  lease: '5s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '10s',
  maxDuration: '30s',
  retry: { maxAttempts: 1 },
});
const intervals: { ref: string; start: number; end: number }[] = [];
const lookup = defineTool({
  name: 'lookup',
  description: 'looks a reference up (slowly)',
  class: io,
  input: z.object({ ref: z.string() }),
  output: z.object({ ref: z.string(), found: z.boolean() }),
  run: async ({ ref }) => {
    const start = performance.now();
    await new Promise((r) => setTimeout(r, 300));
    intervals.push({ ref, start, end: performance.now() });
    if (ref.startsWith('bad')) throw new PermanentError(`no such reference ${ref}`, { code: 'not_found' });
    return { ref, found: true };
  },
});

describe('agents run one answer’s tool calls in parallel (PostgreSQL)', () => {
  let db: TestDatabase;
  let model: ScriptedModel;
  let r: Ratchet;
  let script: ScriptedAnswer[] = [];
  let served = 0;
  beforeAll(async () => {
    db = await createTestDatabase('agent_parallel');
    model = await startScriptedModel({ script: () => script[served++] ?? { content: 'done' } });
    const agent = (name: string, maxToolErrors?: number) =>
      defineAgent({
        name,
        input: z.object({ q: z.string() }),
        model: { name: 'scripted', class: llm, baseURL: model.baseURL },
        instructions: 'Look things up.',
        tools: [lookup],
        maxActions: 5,
        ...(maxToolErrors !== undefined ? { maxToolErrors } : {}),
      });
    r = await createRatchet({ databaseUrl: db.url, logger: silentLogger(), workflows: [agent('looker'), agent('fragile', 1)] });
    await r.worker({ pollIntervalMs: 50, concurrency: 5 }).start();
  });
  afterAll(async () => {
    await r?.close();
    await model?.close();
    await db?.drop();
  });
  const run = async (workflow: string, answers: ScriptedAnswer[]): Promise<{ run: RunView; first: number }> => {
    script = answers;
    served = 0;
    const first = model.requests.length;
    const { id } = await r.submit(workflow, { q: 'x' });
    for (let i = 0; i < 600; i++) {
      const v = (await r.getRun(id))!;
      if (['succeeded', 'failed'].includes(v.state)) return { run: v, first };
      await new Promise((res) => setTimeout(res, 25));
    }
    throw new Error('agent run did not end');
  };
  const call = (ref: string, id: string) => ({ name: 'lookup', arguments: { ref }, id });

  it('three calls of one answer overlap; the next model call sees all three results', async () => {
    intervals.length = 0;
    const { run: v, first } = await run('looker', [
      { toolCalls: [call('a', 'c1'), call('b', 'c2'), call('c', 'c3')] },
      { content: 'found all three' },
    ]);
    expect(v.state).toBe('succeeded');
    expect(v.result).toEqual({ answer: 'found all three' });
    expect(v.stages.map((s) => s.tool)).toEqual(['$model', 'lookup', 'lookup', 'lookup', '$model']);
    const [x, y, z3] = ['a', 'b', 'c'].map((ref) => intervals.find((i) => i.ref === ref)!);
    // Pairwise overlap of all three running intervals: they ran at once.
    expect(Math.max(x!.start, y!.start, z3!.start)).toBeLessThan(Math.min(x!.end, y!.end, z3!.end));
    const second = model.requests[first + 1]!;
    const told = second.messages.filter((m) => m.role === 'tool');
    expect(told.map((m) => m.tool_call_id).sort()).toEqual(['c1', 'c2', 'c3']);
    expect(model.requests.length - first).toBe(2);
  });

  it('a tool that fails for good is told to the model, which recovers', async () => {
    const { run: v, first } = await run('looker', [
      { toolCalls: [call('bad-1', 'e1'), call('ok-1', 'e2')] },
      { content: 'one was missing' },
    ]);
    expect(v.state).toBe('succeeded');
    expect(v.stages.map((s) => s.state)).toEqual(['succeeded', 'failed', 'succeeded', 'succeeded']);
    const told = model.requests[first + 1]!.messages.find((m) => m.tool_call_id === 'e1')!;
    expect(JSON.parse(told.content as string)).toMatchObject({ error: 'tool_failed', code: 'not_found' });
  });

  it('more than maxToolErrors failed calls end the run with too_many_tool_errors', async () => {
    const { run: v } = await run('fragile', [{ toolCalls: [call('bad-a', 'f1'), call('bad-b', 'f2')] }, { content: 'never' }]);
    expect(v.state).toBe('failed');
    expect(v.error).toMatchObject({ code: 'too_many_tool_errors' });
  });
});
