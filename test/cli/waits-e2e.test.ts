import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunView } from '../../src/engine.js';
import type { Worker } from '../../src/worker/worker.js';
import { startApi, TOKEN, type Api } from '../api/helpers.js';
import { waitWorkflows } from '../api/waits-fixtures.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * `ratchet approve | reject | signal | list --state awaiting_approval | explain` end to end
 * (`node bin/ratchet.mjs` in a child process) against a served API whose worker runs the waits
 * (issue 10 phase 2): runs are submitted, reach their wait through a real claim, and the CLI's
 * decision or signal carries them on to their end. Bad input: a typed exit code, nothing written.
 * (test/cli/waits-commands.test.ts covers the commands' options against waits made by hand.) Each
 * command is a tsx child process (1-5 s on a busy machine), hence the long test timeouts.
 */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

function ratchet(args: string[]): Promise<{ code: number | null; json: any; error: any; stderr: string }> {
  return new Promise((resolve, reject) => {
    const env = { ...process.env };
    for (const name of ['DATABASE_URL', 'RATCHET_DATA_DIR', 'RATCHET_URL', 'RATCHET_TOKEN', 'REDIS_URL']) delete env[name];
    const child = spawn(process.execPath, ['bin/ratchet.mjs', ...args], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`ratchet ${args.join(' ')} did not exit; stderr: ${stderr}`));
    }, 90_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      const out = stdout.split('\n').filter((l) => l.startsWith('{'));
      const err = stderr
        .split('\n')
        .filter((l) => l.startsWith('{"error"'))
        .at(-1);
      resolve({ code, json: out.length ? JSON.parse(out.at(-1)!) : undefined, error: err ? JSON.parse(err).error : undefined, stderr });
    });
  });
}

let db: TestDatabase;
let api: Api;
let worker: Worker;
let remote: string[];
beforeAll(async () => {
  db = await createTestDatabase('cli_waits_e2e');
  api = await startApi({ databaseUrl: db.url, workflows: waitWorkflows });
  worker = api.ratchet.worker({ pollIntervalMs: 100, sweepIntervalMs: 200 });
  await worker.start();
  remote = ['--url', api.server.url, '--token', TOKEN, '--json'];
});
afterAll(async () => {
  await worker?.stop({ graceMs: 0 });
  await api?.close();
  await db?.drop();
});

async function until(id: string, pred: (run: RunView) => boolean, what: string, timeoutMs = 30_000): Promise<RunView> {
  const end = Date.now() + timeoutMs;
  let last: RunView | null = null;
  while (Date.now() < end) {
    last = await api.ratchet.getRun(id);
    if (last && pred(last)) return last;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}; last: ${JSON.stringify(last)}`);
}

/** Rows that a decision or a signal writes: none may appear after refused input. */
const written = async () =>
  (
    await api.ratchet.store.db.query(
      `SELECT (SELECT count(*) FROM ratchet.events)::int AS events, (SELECT count(*) FROM ratchet.signals)::int AS signals,
              (SELECT count(*) FROM ratchet.waits WHERE ended_at IS NOT NULL)::int AS ended`,
    )
  )[0];
const stageIdOf = async (runId: string, seq: number) =>
  (await api.ratchet.store.db.query(`SELECT id::text FROM ratchet.stages WHERE run_id = $1::uuid AND seq = $2`, [runId, seq]))[0]!
    .id as string;

describe('approval gates decided by the CLI, run by the worker', () => {
  it('list finds the waiting call, explain names the command, bad input exits 2 with nothing written, approve (edited) runs it, a second decision exits 7', async () => {
    const { id } = await api.ratchet.submit('gated', { invoiceId: 'e2e-1', amount: 10 });
    await until(id, (r) => r.stages[0]!.state === 'awaiting_approval', 'the call awaits approval');
    const stageId = await stageIdOf(id, 1);

    const listed = await ratchet([...remote, 'list', '--state', 'awaiting_approval']);
    expect(listed.code).toBe(0);
    expect(listed.json.approvals).toContainEqual(
      expect.objectContaining({ runId: id, stageId, tool: 'create_case', input: { invoiceId: 'e2e-1', amount: 10 } }),
    );
    const explained = await ratchet([...remote, 'explain', id]);
    expect(explained.code).toBe(0);
    expect(explained.json).toMatchObject({
      verdict: 'awaiting_approval',
      evidence: { approveWith: `ratchet approve ${id} --stage ${stageId}` },
    });

    const before = await written();
    const badEdit = await ratchet([...remote, 'approve', id, '--stage', stageId, '--input', '{"invoiceId":"e2e-1","amount":-5}']);
    expect([badEdit.code, badEdit.error?.code, badEdit.error?.path]).toEqual([2, 'invalid_input', 'input.amount']);
    const badJson = await ratchet([...remote, 'approve', id, '--input', '{nope']);
    expect([badJson.code, badJson.error?.code]).toEqual([2, 'invalid_input']);
    const badStage = await ratchet([...remote, 'approve', id, '--stage', 'x1']);
    expect([badStage.code, badStage.error?.code]).toEqual([2, 'invalid_input']);
    const unknownRun = await ratchet([...remote, 'approve', '01890f4e-0000-7000-8000-00000000beef']);
    expect([unknownRun.code, unknownRun.error?.code]).toEqual([3, 'unknown_run']);
    expect(await written()).toEqual(before);
    expect((await api.ratchet.getRun(id))!.stages[0]!.state).toBe('awaiting_approval');

    const ok = await ratchet([
      ...remote,
      'approve',
      id,
      '--input',
      '{"invoiceId":"e2e-1","amount":8}',
      '--by',
      'Ana',
      '--reason',
      '8 is right',
    ]);
    expect(ok.code, ok.stderr).toBe(0);
    expect(ok.json).toMatchObject({ decision: 'approved', stageId, actor: 'Ana', inputHash: expect.any(String) });
    const done = await until(id, (r) => r.state === 'succeeded', 'the run succeeds after the approval');
    expect(done.stages.map((s) => [s.tool, s.state])).toEqual([
      ['create_case', 'succeeded'],
      ['ship', 'succeeded'],
    ]);
    const [row] = await api.ratchet.store.db.query(`SELECT input, result FROM ratchet.stages WHERE id = $1::bigint`, [stageId]);
    expect(row).toMatchObject({ input: { invoiceId: 'e2e-1', amount: 8 }, result: { caseId: 'case-e2e-1' } });

    const again = await ratchet([...remote, 'reject', id, '--stage', stageId]);
    expect(again.code).toBe(7);
    expect(['already_decided', 'not_awaiting_approval', 'already_terminal']).toContain(again.error?.code);
  }, 180_000);

  it('reject fails a static run with approval_rejected; the call never runs', async () => {
    const { id } = await api.ratchet.submit('gated', { invoiceId: 'e2e-2', amount: 3 });
    await until(id, (r) => r.stages[0]!.state === 'awaiting_approval', 'the call awaits approval');
    const no = await ratchet([...remote, 'reject', id, '--reason', 'duplicate invoice', '--by', 'Bo']);
    expect(no.code, no.stderr).toBe(0);
    expect(no.json).toMatchObject({ decision: 'rejected', actor: 'Bo', reason: 'duplicate invoice', runEnded: 'failed' });
    const run = await until(id, (r) => r.state === 'failed', 'the run fails');
    expect(run.error).toMatchObject({ code: 'approval_rejected' });
    expect(run.stages.map((s) => s.state)).toEqual(['failed', 'cancelled']);
    const [row] = await api.ratchet.store.db.query(`SELECT result FROM ratchet.stages WHERE run_id = $1::uuid AND seq = 1`, [id]);
    expect(row!.result).toBeNull();
  }, 180_000);
});

describe('signals sent by the CLI, consumed by the worker', () => {
  it('a signal before the wait is kept, then consumed when the wait starts; the payload is the stage output', async () => {
    const { id } = await api.ratchet.submit('hooked', {});
    // Possibly before the worker reached the wait: kept (202) or delivered (200); either way it is consumed once.
    const sent = await ratchet([...remote, 'signal', id, 'paid', '--data', '{"paid":true,"ref":"early"}', '--signal-id', 'early-1']);
    expect(sent.code, sent.stderr).toBe(0);
    expect(['kept', 'delivered']).toContain(sent.json.status);
    const done = await until(id, (r) => r.state === 'succeeded', 'the run succeeds');
    const [row] = await api.ratchet.store.db.query(`SELECT result FROM ratchet.stages WHERE run_id = $1::uuid AND seq = 2`, [id]);
    expect(row!.result).toEqual({ paid: true, ref: 'early' });
    expect(done.stages.map((s) => s.state)).toEqual(['succeeded', 'succeeded', 'succeeded']);
  }, 180_000);

  it('to a waiting stage: bad payload exits 2, unknown name 3, nothing written; delivered once per Signal-Id; after the end exits 7', async () => {
    const { id } = await api.ratchet.submit('hooked', {});
    await until(id, (r) => r.stages[1]!.state === 'waiting', 'the signal wait starts');

    const before = await written();
    const badPayload = await ratchet([...remote, 'signal', id, 'paid', '--data', '{"paid":"yes"}']);
    expect([badPayload.code, badPayload.error?.code, badPayload.error?.path]).toEqual([2, 'invalid_input', 'payload.paid']);
    const badJson = await ratchet([...remote, 'signal', id, 'paid', '--data', '{paid']);
    expect([badJson.code, badJson.error?.code]).toEqual([2, 'invalid_input']);
    const unknownName = await ratchet([...remote, 'signal', id, 'refund', '--data', '{}']);
    expect([unknownName.code, unknownName.error?.code]).toEqual([3, 'unknown_signal']);
    expect(await written()).toEqual(before);
    expect((await api.ratchet.getRun(id))!.stages[1]!.state).toBe('waiting');

    const args = [...remote, 'signal', id, 'paid', '--data', '{"paid":true,"ref":"r-2"}', '--signal-id', 'sig-2'];
    const first = await ratchet(args);
    expect(first.code, first.stderr).toBe(0);
    expect(first.json).toMatchObject({ status: 'delivered', duplicate: false, signalId: 'sig-2' });
    const dup = await ratchet(args);
    expect(dup.code).toBe(0);
    expect(dup.json).toMatchObject({ status: 'delivered', duplicate: true, signalId: 'sig-2' });
    await until(id, (r) => r.state === 'succeeded', 'the run succeeds');
    const [n] = await api.ratchet.store.db.query(`SELECT count(*)::int AS n FROM ratchet.signals WHERE run_id = $1::uuid`, [id]);
    expect(n!.n).toBe(1);

    const late = await ratchet([...remote, 'signal', id, 'paid', '--data', '{"paid":true,"ref":"late"}']);
    expect([late.code, late.error?.code]).toEqual([7, 'already_terminal']);
  }, 180_000);
});
