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
 * A model's answer is checked like a tool's output, its invalid output leaves only a hash and
 * a size in the events, and a run whose model stage failed can be retried — on PostgreSQL,
 * against the scripted OpenAI-compatible server.
 */
describe('model output', () => {
  let db: TestDatabase;
  let witness: Witness;
  let model: ScriptedModel;
  let r: Ratchet;
  let script: ScriptedAnswer[] = [];
  let served = 0;

  const llm = defineToolClass({
    name: 'llm_out',
    lease: '5s',
    heartbeat: '1s',
    jitter: '200ms',
    timeout: '4s',
    maxDuration: '30s',
    retry: { maxAttempts: 3, backoff: { initial: '50ms' } },
  });
  const agent = (name: string, extra: { maxReplans?: number } = {}) =>
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
    db = await createTestDatabase('model_output');
    witness = await startWitness(db.url);
    process.env.WITNESS_URL = witness.url;
    process.env.STAGE_MS = '10';
    model = await startScriptedModel({ script: () => script[served++] ?? { content: 'done' } });
    const withUrl = (a: ReturnType<typeof agent>) => ({
      ...a,
      agent: { ...a.agent!, model: { ...a.agent!.model, baseURL: model.baseURL } },
    });
    r = await createRatchet({
      databaseUrl: db.url,
      logger: silentLogger(),
      workflows: [withUrl(agent('out_main')), withUrl(agent('out_strict', { maxReplans: 0 }))],
    });
    await r.worker({ pollIntervalMs: 50 }).start();
  });
  afterAll(async () => {
    await r?.close();
    await model?.close();
    await witness?.close();
    await db?.drop();
  });

  const ended = async (id: string): Promise<RunView> => {
    for (let i = 0; i < 800; i++) {
      const v = (await r.getRun(id))!;
      if (['succeeded', 'failed', 'cancelled', 'expired'].includes(v.state)) return v;
      await new Promise((res) => setTimeout(res, 25));
    }
    throw new Error('run did not end');
  };
  const start = (answers: ScriptedAnswer[]) => {
    script = answers;
    served = 0;
    return model.requests.length;
  };

  it('a NUL in the model answer fails the model stage permanently with a clear lastError; the model is not asked again', async () => {
    const first = start([{ content: 'the total is 4\u00002' }]);
    const { id } = await r.submit('out_main', { ref: 'nul' });
    const run = await ended(id);
    expect(run.state).toBe('failed');
    expect(model.requests.length - first).toBe(1);
    expect(run.stages).toHaveLength(1);
    expect(run.stages[0]).toMatchObject({ state: 'failed', attempt: 1, lastError: { code: 'invalid_model_output', kind: 'permanent' } });
    expect((run.stages[0]!.lastError as { message: string }).message).toMatch(/\\u0000/);

    // The failed model stage is retried like any failed stage: the model is asked again.
    const again = start([{ content: 'the total is 42' }]);
    expect(await r.retry(id)).toMatchObject({ retried: true, stage: { seq: 1 } });
    const done = await ended(id);
    expect(done.state).toBe('succeeded');
    expect(done.result).toEqual({ answer: 'the total is 42' });
    expect(model.requests.length - again).toBe(1);
  });

  it('invalid model output is recorded in the events as a hash and a size, never its text or arguments', async () => {
    const secret = 'SECRET-ARGUMENT-7f3a';
    const prose = 'PROMPT-ECHO-TEXT-19bd';
    start([{ content: prose, toolCalls: [{ name: 'drop_tables_now', arguments: { secret } }] }, { content: 'nothing then' }]);
    const { id } = await r.submit('out_main', { ref: 'quiet' });
    const run = await ended(id);
    expect(run.state).toBe('succeeded');
    const events = await r.events(id);
    const text = JSON.stringify(events);
    for (const payload of [secret, prose, 'drop_tables_now']) expect(text).not.toContain(payload);
    const refused = events.find((e) => (e.data as { decision?: string } | null)?.decision === 'replan')!;
    expect(refused.data).toMatchObject({
      resultHash: expect.stringMatching(/^[0-9a-f]{16}$/),
      resultBytes: expect.any(Number),
      invalidActions: [{ callId: expect.any(String), index: 0, reason: 'unknown_tool' }],
    });
    expect(refused.data).not.toHaveProperty('modelOutput');
  });

  it('a run failed with invalid_actions is retried from its model stage', async () => {
    const first = start([{ toolCalls: [{ name: 'forbidden_tool_x9', arguments: {} }] }]);
    const { id } = await r.submit('out_strict', { ref: 'strict' });
    const run = await ended(id);
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'invalid_actions' });
    expect(run.stages.map((s) => [s.tool, s.state])).toEqual([['$model', 'failed']]);
    expect(model.requests.length - first).toBe(1);
    // The refusal in full (it quotes the model) is on the stage; the run's error, which events copy, names reasons only.
    expect(JSON.stringify(run.stages[0]!.lastError)).toContain('forbidden_tool_x9');
    expect(JSON.stringify(run.error)).not.toContain('forbidden_tool_x9');

    start([{ content: 'filed nothing' }]);
    expect(await r.retry(id)).toMatchObject({ retried: true, stage: { seq: 1, tool: '$model' } });
    const done = await ended(id);
    expect(done.state).toBe('succeeded');
    expect(done.result).toEqual({ answer: 'filed nothing' });
    const events = await r.events(id);
    expect(events.map((e) => e.type)).toContain('run_retried');
    expect(JSON.stringify(events)).not.toContain('forbidden_tool_x9');
  });
});
