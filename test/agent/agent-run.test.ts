import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startScriptedModel, type ScriptedAnswer, type ScriptedModel } from '../../src/agent/scripted-model.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineToolClass } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { effectTool } from '../fixtures/fault-workflows/agent.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startWitness, type Witness } from '../helpers/witness.js';

/**
 * The agent loop on the embedded store against a scripted OpenAI-compatible server (a real
 * HTTP server on loopback), with tool effects at the fenced witness receiver.
 */
describe('agents', () => {
  let db: TestDatabase;
  let witness: Witness;
  let model: ScriptedModel;
  let r: Ratchet;
  let script: ScriptedAnswer[] = [];
  let served = 0;

  const llm = defineToolClass({
    name: 'llm',
    lease: '5s',
    heartbeat: '1s',
    jitter: '200ms',
    timeout: '4s',
    maxDuration: '30s',
    retry: { maxAttempts: 2, backoff: { initial: '50ms' } },
  });
  const agent = (name: string, extra: { maxReplans?: number; maxSteps?: number } = {}) =>
    defineAgent({
      name,
      input: z.object({ ref: z.string() }),
      model: { name: 'scripted', class: llm, baseURL: 'http://placeholder' },
      instructions: 'File a case, then answer.',
      tools: [effectTool],
      maxActions: 3,
      ...extra,
    });

  beforeAll(async () => {
    db = await createTestDatabase('agents', { empty: true });
    witness = await startWitness(db.url);
    process.env.WITNESS_URL = witness.url;
    process.env.STAGE_MS = '10';
    model = await startScriptedModel({ script: () => script[served++] ?? { content: 'done' } });
    const withUrl = (a: ReturnType<typeof agent>) => ({
      ...a,
      agent: { ...a.agent!, model: { ...a.agent!.model, baseURL: model.baseURL } },
    });
    r = await createRatchet({
      dataDir: ':memory:',
      logger: silentLogger(),
      workflows: [withUrl(agent('main')), withUrl(agent('strict', { maxReplans: 1 })), withUrl(agent('short', { maxSteps: 2 }))],
    });
    await r.worker({ pollIntervalMs: 50 }).start();
  });
  afterAll(async () => {
    await r.close();
    await model.close();
    await witness.close();
    await db.drop();
  });

  const run = async (
    workflow: string,
    answers: ScriptedAnswer[],
    ref: string,
  ): Promise<{ run: RunView; requests: number; first: number }> => {
    script = answers;
    served = 0;
    const first = model.requests.length;
    const { id } = await r.submit(workflow, { ref });
    for (let i = 0; i < 400; i++) {
      const v = (await r.getRun(id))!;
      if (['succeeded', 'failed'].includes(v.state)) return { run: v, requests: model.requests.length - first, first };
      await new Promise((res) => setTimeout(res, 25));
    }
    throw new Error('agent run did not end');
  };
  const tools = (v: RunView) => v.stages.filter((s) => s.tool !== '$model');

  it('runs the loop: a proposed action becomes a stage with its own key and class lease; the result goes back to the model', async () => {
    const {
      run: v,
      requests,
      first,
    } = await run(
      'main',
      [{ toolCalls: [{ name: 'effect_tool', arguments: { ref: 'loop', lease: '999s', retry: 9 } }] }, { content: 'filed' }],
      'loop',
    );
    expect(v.state).toBe('succeeded');
    expect(v.result).toEqual({ answer: 'filed' });
    expect(v.stages.map((s) => s.tool)).toEqual(['$model', 'effect_tool', '$model']);
    expect(requests).toBe(2); // each answer asked for once
    const [row] = await r.store.db.query(
      `SELECT input, lease_ms, max_attempts FROM ratchet.stages WHERE run_id = $1 AND tool = 'effect_tool'`,
      [v.id],
    );
    expect(row).toEqual({ input: { ref: 'loop' }, lease_ms: 3000, max_attempts: 5 }); // from the class, not the model
    const second = model.requests[first + 1]!;
    expect(second.messages.at(-1)).toMatchObject({ role: 'tool', content: expect.stringContaining('"ref":"loop"') });
    expect((await witness.appliedPerKey()).get('case:loop')).toBe(1);
  });

  it('offers each tool as the JSON Schema of its zod input', async () => {
    const { first } = await run('main', [{ content: 'nothing to do' }], 'schema');
    const offered = model.requests[first]!.tools!;
    expect(offered.map((t) => t.function.name)).toEqual(['effect_tool']);
    const expected = z.toJSONSchema(effectTool.input, { io: 'input' }) as Record<string, unknown>;
    delete expected.$schema;
    expect(offered[0]!.function.parameters).toEqual(expected);
  });

  it('the same create action proposed again in a later turn is one effect (the key derives from the invoice)', async () => {
    const { run: v } = await run(
      'main',
      [
        { toolCalls: [{ name: 'effect_tool', arguments: { ref: 'inv-7' } }] },
        { toolCalls: [{ name: 'effect_tool', arguments: { ref: 'inv-7' } }] },
        { content: 'done twice' },
      ],
      'inv-7',
    );
    expect(v.state).toBe('succeeded');
    expect(tools(v)).toHaveLength(2);
    expect((await witness.appliedPerKey()).get('case:inv-7')).toBe(1);
    expect(witness.requests.filter((q) => q.key === 'case:inv-7').map((q) => q.verdict)).toEqual(['applied', 'replayed']);
  });

  const bad: [string, ScriptedAnswer][] = [
    ['an unknown tool', { toolCalls: [{ name: 'drop_tables', arguments: {} }] }],
    ['a Cyrillic look-alike name', { toolCalls: [{ name: 'effect_tооl', arguments: { ref: 'x' } }] }],
    ['arguments failing the schema', { toolCalls: [{ name: 'effect_tool', arguments: { ref: 42 } }] }],
    ['arguments that are not JSON', { toolCalls: [{ name: 'effect_tool', arguments: "{ref: 'x'}" }] }],
    ['arguments in markdown fences', { toolCalls: [{ name: 'effect_tool', arguments: '```json\n{"ref":"x"}\n```' }] }],
    ['too many actions', { toolCalls: [1, 2, 3, 4].map((n) => ({ name: 'effect_tool', arguments: { ref: `many-${n}` } })) }],
    [
      'one bad action among good ones',
      {
        toolCalls: [
          { name: 'effect_tool', arguments: { ref: 'good' } },
          { name: 'effect_tool', arguments: 'nope' },
        ],
      },
    ],
  ];
  for (const [what, answer] of bad) {
    it(`refuses ${what}: no stage from the list, the error goes back to the model, which re-plans`, async () => {
      const { run: v, requests, first } = await run('main', [answer, { content: 'ok, nothing then' }], `bad-${what}`);
      expect(v.state).toBe('succeeded');
      expect(tools(v)).toEqual([]); // nothing persisted from the invalid list
      expect(requests).toBe(2);
      const feedback = model.requests[first + 1]!.messages.slice(3);
      expect(JSON.stringify(feedback)).toContain('invalid_action');
      const planned = (await r.events(v.id)).find(
        (e) => e.type === 'stage_succeeded' && (e.data as { decision?: string }).decision === 'replan',
      );
      expect(planned?.data).toMatchObject({
        resultHash: expect.any(String),
        resultBytes: expect.any(Number),
        invalidActions: expect.any(Array),
      });
      expect(planned?.data).not.toHaveProperty('modelOutput');
    });
  }

  it('fails the model stage and the run with invalid_actions once re-plans run out, a hash of the output (not its text) in the events', async () => {
    const badAnswer: ScriptedAnswer = { toolCalls: [{ name: 'nope', arguments: {} }] };
    const { run: v, requests } = await run('strict', [badAnswer, badAnswer, { content: 'never asked' }], 'strict');
    expect(v.state).toBe('failed');
    expect(v.error).toMatchObject({ code: 'invalid_actions' });
    expect(requests).toBe(2);
    expect(tools(v)).toEqual([]);
    const ev = (await r.events(v.id)).filter((e) => (e.data as { decision?: string } | null)?.decision === 'invalid_actions');
    expect(ev).toHaveLength(1);
    expect(ev[0]!.type).toBe('stage_failed');
    expect(ev[0]!.data).toMatchObject({ invalidActions: [{ reason: 'unknown_tool' }], resultHash: expect.any(String) });
    expect(JSON.stringify(ev[0]!.data)).not.toContain('"nope"');
  });

  it('ends with a clear error when the model still proposes actions at maxSteps', async () => {
    const again = (n: number): ScriptedAnswer => ({ toolCalls: [{ name: 'effect_tool', arguments: { ref: `steps-${n}` } }] });
    const { run: v } = await run('short', [again(1), again(2), again(3)], 'short');
    expect(v.state).toBe('failed');
    expect(v.error).toMatchObject({ code: 'max_steps_exceeded' });
    expect(v.stages.filter((s) => s.tool === '$model')).toHaveLength(2);
  });
});
