import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ChatRequest, ScriptedModel } from '../../src/agent/scripted-model.js';
import { startScriptedModel } from '../../src/agent/scripted-model.js';
import type { ModelStageResult } from '../../src/agent/model-output.js';
import type { Ratchet } from '../../src/engine.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.js';
import { startWitness, type Witness } from '../helpers/witness.js';
import { submitter, waitRun, Workers } from './helpers.js';

/** The planning step a request belongs to: how many tool results the conversation already holds. */
const stepOf = (req: ChatRequest) => req.messages.filter((m) => m.role === 'tool').length;

/**
 * An agent survives crashes without asking the model twice for an answer it already has,
 * and without repeating a side effect: real worker processes, a scripted OpenAI-compatible
 * server, a fenced witness.
 */
describe('agent crashes', () => {
  let db: TestDatabase;
  let witness: Witness;
  let model: ScriptedModel;
  let r: Ratchet;
  let workers: Workers;
  let beforeAnswer: (index: number) => Promise<void> = async () => {};

  beforeAll(async () => {
    db = await createTestDatabase('agent_crash');
    witness = await startWitness(db.url);
    model = await startScriptedModel({
      // Propose one case for the run's reference until a tool result is in the conversation.
      script: (req) => {
        const ref = (JSON.parse(String(req.messages[1]?.content ?? '{}')) as { ref?: string }).ref ?? 'x';
        return stepOf(req) === 0 ? { toolCalls: [{ name: 'effect_tool', arguments: { ref } }] } : { content: `case filed for ${ref}` };
      },
      beforeAnswer: (index) => beforeAnswer(index),
    });
    r = await submitter(db.url);
    workers = new Workers({ DATABASE_URL: db.url, WITNESS_URL: witness.url, OPENAI_BASE_URL: model.baseURL, OPENAI_API_KEY: 'test' });
  });
  afterEach(async (ctx) => {
    if (ctx.task.result?.state === 'fail') console.error(workers.logs());
    await workers.killAll();
    beforeAnswer = async () => {};
  });
  afterAll(async () => {
    await workers.killAll();
    await r.close();
    await model.close();
    await witness.close();
    await db.drop();
  });

  const requestsFor = (ref: string) => model.requests.filter((q) => String(q.messages[1]?.content).includes(`"${ref}"`));

  /** Every tool stage was planned by a committed model stage before it (no stage without its plan). */
  async function assertPlanned(runId: string) {
    const stages = await db.query<{ seq: number; name: string; tool: string; state: string; result: unknown }>(
      'SELECT seq, name, tool, state, result FROM ratchet.stages WHERE run_id = $1 ORDER BY seq',
      [runId],
    );
    for (const s of stages.filter((x) => x.tool !== '$model')) {
      const planner = stages.filter((m) => m.tool === '$model' && m.seq < s.seq).at(-1);
      expect(planner?.state, `stage ${s.seq}`).toBe('succeeded');
      const calls = (planner!.result as ModelStageResult).message.tool_calls ?? [];
      expect(
        calls.map((c) => c.id),
        `stage ${s.seq}`,
      ).toContain(s.name);
    }
  }

  it('a crash after the answer arrives but before its finish commits: the model is asked again, once', async () => {
    const proxy: TcpProxy = await startTcpProxy({ target: { host: '127.0.0.1', port: Number(new URL(db.url).port) } });
    try {
      const ref = 'before-commit';
      // The first answer reaches W1 only after W1's database link is cut: its finish cannot commit.
      beforeAnswer = async (index) => {
        if (requestsFor(ref).length === 1 && model.requests.length - 1 === index) proxy.setMode('blackhole');
      };
      const w1 = await workers.spawn('w1', { DATABASE_URL: proxy.url(db.url) });
      const { id } = await r.submit('fault_agent', { ref });
      await witness.waitFor(() => requestsFor(ref).length >= 1, 30_000, 'first model request');
      await new Promise((res) => setTimeout(res, 300)); // the answer is in W1's hands
      w1.proc.kill('SIGKILL');
      await w1.exit;
      expect((await r.getRun(id))!.stages.map((s) => s.tool)).toEqual(['$model']); // nothing planned without a committed answer
      beforeAnswer = async () => {};
      await workers.spawn('w2');
      const done = await waitRun(r, id, (v) => v.state === 'succeeded', 60_000, 'agent run succeeded');
      expect(done.result).toEqual({ answer: `case filed for ${ref}` });
      expect(requestsFor(ref).filter((q) => stepOf(q) === 0)).toHaveLength(2); // asked again: the answer was never committed
      expect(requestsFor(ref).filter((q) => stepOf(q) === 1)).toHaveLength(1);
      expect(done.stages[0]!.attempt).toBe(2);
      await assertPlanned(id);
      expect((await witness.appliedPerKey()).get(`case:${ref}`)).toBe(1);
    } finally {
      await proxy.close();
    }
  });

  it('a crash after the finish commits (in the middle of the tool stage): the model is not asked again; the effect lands once with a new fence', async () => {
    const ref = 'after-commit';
    const w1 = await workers.spawn('w1', { STAGE_MS: '3000' });
    const { id } = await r.submit('fault_agent', { ref });
    const running = await waitRun(
      r,
      id,
      (v) => v.stages[0]?.state === 'succeeded' && v.stages[1]?.state === 'running',
      30_000,
      'tool stage running',
    );
    await witness.waitFor(() => witness.observations.find((o) => o.kind === 'tool_started' && o.ref === ref), 10_000, 'tool started');
    w1.proc.kill('SIGKILL');
    await w1.exit;
    await workers.spawn('w2', { STAGE_MS: '50' });
    const done = await waitRun(r, id, (v) => v.state === 'succeeded', 60_000, 'agent run succeeded');
    expect(requestsFor(ref).filter((q) => stepOf(q) === 0)).toHaveLength(1); // the committed answer was never asked for again
    expect(requestsFor(ref)).toHaveLength(2); // exactly once per planning step
    const tool = done.stages[1]!;
    expect(tool.attempt).toBe(2);
    expect(BigInt(tool.fence!)).toBeGreaterThan(BigInt(running.stages[1]!.fence!));
    await assertPlanned(id);
    expect((await witness.appliedPerKey()).get(`case:${ref}`)).toBe(1);
    expect(witness.staleAccepted()).toEqual([]);
  });
});
