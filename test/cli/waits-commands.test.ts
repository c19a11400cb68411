import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { beginWait } from '../../src/store/signals.js';
import { startApi, TOKEN, type Api } from '../api/helpers.js';
import { allowWaitStates, claimStage, createWaitRun, gated, hooked, waitWorkflows } from '../api/waits-fixtures.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * `ratchet signal | approve | reject | list --state awaiting_approval` as a user types them
 * (`node bin/ratchet.mjs` in a child process) against a real server: exit codes and --json.
 */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'ratchet-cli-waits-'));

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
let remote: string[];
beforeAll(async () => {
  db = await createTestDatabase('cli_waits');
  api = await startApi({ databaseUrl: db.url, workflows: waitWorkflows });
  await allowWaitStates(api.ratchet.store.db);
  remote = ['--url', api.server.url, '--token', TOKEN, '--json'];
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
  rmSync(tmp, { recursive: true, force: true });
});

const count = async (table: string) =>
  (await api.ratchet.store.db.query(`SELECT count(*)::int AS n FROM ratchet.${table}`))[0]!.n as number;

describe('ratchet approve / reject / list --state awaiting_approval', () => {
  it('lists what waits for a person; refuses a bad edit (exit 2) and a bad --stage (exit 2) with nothing written; approves (exit 0); a second decision exits 7', async () => {
    const run = await createWaitRun(api.ratchet, gated, { invoiceId: 'cli-1', amount: 10 });
    const s0 = run.stageIds[0]!;
    await beginWait(api.ratchet.store.db, await claimStage(api.ratchet.store.db, s0), { kind: 'approval', until: null });

    const listed = await ratchet([...remote, 'list', '--state', 'awaiting_approval']);
    expect(listed.code).toBe(0);
    expect(listed.json.approvals).toContainEqual(expect.objectContaining({ runId: run.id, stageId: s0, tool: 'create_case' }));
    // A filter of runs does not apply to this list of stages: refused (exit 2), never silently ignored.
    const filtered = await ratchet([...remote, 'list', '--state', 'awaiting_approval', '--workflow', 'other']);
    expect([filtered.code, filtered.error?.code, filtered.error?.path]).toEqual([2, 'invalid_input', 'workflow']);

    const events = await count('events');
    const bad = await ratchet([...remote, 'approve', run.id, '--input', '{"invoiceId":"cli-1","amount":-1}']);
    expect([bad.code, bad.error?.code, bad.error?.path]).toEqual([2, 'invalid_input', 'input.amount']);
    const notJson = await ratchet([...remote, 'approve', run.id, '--input', '{nope']);
    expect([notJson.code, notJson.error?.code]).toEqual([2, 'invalid_input']);
    const badStage = await ratchet([...remote, 'reject', run.id, '--stage', 'abc']);
    expect([badStage.code, badStage.error?.code]).toEqual([2, 'invalid_input']);
    expect(await count('events')).toBe(events);

    const file = join(tmp, 'edit.json');
    writeFileSync(file, JSON.stringify({ invoiceId: 'cli-1', amount: 8 }));
    const ok = await ratchet([...remote, 'approve', run.id, '--input', `@${file}`, '--by', 'Ana', '--reason', 'ok at 8']);
    expect(ok.code).toBe(0);
    expect(ok.json).toMatchObject({ decision: 'approved', stageId: s0, actor: 'Ana', reason: 'ok at 8' });
    const again = await ratchet([...remote, 'reject', run.id, '--stage', s0]);
    expect([again.code, again.error?.code]).toEqual([7, 'already_decided']);
    const none = await ratchet([...remote, 'approve', run.id]);
    expect([none.code, none.error?.code]).toEqual([7, 'not_awaiting_approval']);
  });
});

describe('without a server (the store directly, definitions from --workflows-dir)', () => {
  it('approve records the operating-system user as who decided; a signal is checked by the loaded schema', async () => {
    const local = ['--database-url', db.url, '--json'];
    const dir = fileURLToPath(new URL('../fixtures/wait-workflows', import.meta.url));
    const run = await createWaitRun(api.ratchet, gated, { invoiceId: 'cli-local', amount: 4 });
    await beginWait(api.ratchet.store.db, await claimStage(api.ratchet.store.db, run.stageIds[0]!), { kind: 'approval', until: null });
    const ok = await ratchet([...local, 'approve', run.id, '--workflows-dir', dir, '--by', 'Cy']);
    expect(ok.code).toBe(0);
    expect(ok.json).toMatchObject({
      decision: 'approved',
      stageId: run.stageIds[0],
      actor: 'Cy',
      decidedBy: expect.stringMatching(/^cli:/),
    });
    const hookedRun = await createWaitRun(api.ratchet, hooked, {});
    const bad = await ratchet([...local, 'signal', hookedRun.id, 'paid', '--data', '{"paid":"no"}', '--workflows-dir', dir]);
    expect([bad.code, bad.error?.code, bad.error?.path]).toEqual([2, 'invalid_input', 'payload.paid']);
  });
});

describe('ratchet signal', () => {
  it('keeps a signal sent before the wait (exit 0, --json); bad JSON exits 2, an unknown name 3, an unknown run 3; nothing written', async () => {
    const run = await createWaitRun(api.ratchet, hooked, {});
    const signals = await count('signals');
    const badJson = await ratchet([...remote, 'signal', run.id, 'paid', '--data', '{paid']);
    expect([badJson.code, badJson.error?.code, badJson.error?.path]).toEqual([2, 'invalid_input', 'payload']);
    const unknownName = await ratchet([...remote, 'signal', run.id, 'refund', '--data', '{}']);
    expect([unknownName.code, unknownName.error?.code]).toEqual([3, 'unknown_signal']);
    const unknownRun = await ratchet([...remote, 'signal', '01890f4e-0000-7000-8000-00000000cafe', 'paid', '--data', '{}']);
    expect([unknownRun.code, unknownRun.error?.code]).toEqual([3, 'unknown_run']);
    const badPayload = await ratchet([...remote, 'signal', run.id, 'paid', '--data', '{"paid":1}']);
    expect([badPayload.code, badPayload.error?.code, badPayload.error?.path]).toEqual([2, 'invalid_input', 'payload.paid']);
    expect(await count('signals')).toBe(signals);
    const sent = await ratchet([...remote, 'signal', run.id, 'paid', '--data', '{"paid":true,"ref":"c-1"}', '--signal-id', 'cli-sig']);
    expect(sent.code).toBe(0);
    expect(sent.json).toMatchObject({ status: 'kept', signalId: 'cli-sig', duplicate: false });
    expect(await count('signals')).toBe(signals + 1);
  });
});
