import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/client/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { owe } from '../api/fixtures.js';
import { startApi, TOKEN, until, type Api } from '../api/helpers.js';

/**
 * status / list / events / explain / cancel / retry / run --wait / serve / dev as a user types
 * them (`node bin/ratchet.mjs` in a child process): against a real server (--url / RATCHET_URL),
 * and against the store directly (--database-url). Asserts exit codes and --json output.
 */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const WORKFLOWS = fileURLToPath(new URL('../fixtures/api-workflows', import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'ratchet-cli-api-'));
const UNKNOWN = '01890f4e-0000-7000-8000-00000000cafe';

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
  json: any;
  lines: any[];
  error: any;
}

function ratchet(args: string[], env: NodeJS.ProcessEnv = {}): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const base = { ...process.env };
    for (const name of ['DATABASE_URL', 'RATCHET_DATA_DIR', 'RATCHET_URL', 'RATCHET_TOKEN', 'RATCHET_TOKENS', 'REDIS_URL'])
      delete base[name];
    const child = spawn(process.execPath, ['bin/ratchet.mjs', ...args], {
      cwd: ROOT,
      env: { ...base, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
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
      const lines = stdout
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l));
      const errLine = stderr
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{"error"'))
        .at(-1);
      resolve({ code, stdout, stderr, json: lines.at(-1), lines, error: errLine ? JSON.parse(errLine).error : undefined });
    });
  });
}

let db: TestDatabase;
let api: Api;
let remote: string[];
let local: string[];
const ids: Record<string, string> = {};
beforeAll(async () => {
  db = await createTestDatabase('cli_api');
  api = await startApi({ databaseUrl: db.url });
  await api.ratchet.worker({ classes: ['quick'], pollIntervalMs: 50 }).start();
  remote = ['--url', api.server.url, '--token', TOKEN, '--json'];
  local = ['--database-url', db.url, '--json'];
  ids.ok = (await api.client.submit('echo', { key: 'cli-ok' })).id;
  owe('cli-fail', 2);
  ids.failed = (await api.client.submit('flaky', { key: 'cli-fail' })).id;
  ids.queued = (await api.client.submit('orphan', { key: 'cli-queued' })).id;
  await until(
    'settled',
    async () => (await api.client.get(ids.ok!)).state === 'succeeded' && (await api.client.get(ids.failed!)).state === 'failed',
  );
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
  rmSync(tmp, { recursive: true, force: true });
});

describe('run commands against a server (--url)', () => {
  it('status, list, events, explain: exit 0 and the API JSON', async () => {
    const [status, list, events, explain] = await Promise.all([
      ratchet([...remote, 'status', ids.ok!]),
      ratchet([...remote, 'list', '--state', 'failed,succeeded', '--limit', '10']),
      ratchet([...remote, 'events', ids.failed!]),
      ratchet([...remote, 'explain', ids.queued!]),
    ]);
    expect(status.code, status.stderr).toBe(0);
    expect(status.json).toMatchObject({
      id: ids.ok,
      workflow: 'echo',
      state: 'succeeded',
      result: { key: 'cli-ok' },
      stages: [{ seq: 1, tool: 'echo', state: 'succeeded', attempt: 1 }],
    });
    expect(list.code, list.stderr).toBe(0);
    expect(list.json.runs.map((r: { id: string }) => r.id).sort()).toEqual([ids.ok, ids.failed].sort());
    expect(events.code, events.stderr).toBe(0);
    expect(events.json.events.map((e: { type: string }) => e.type)).toEqual(
      expect.arrayContaining(['run_submitted', 'retry_scheduled', 'run_failed']),
    );
    expect(explain.code, explain.stderr).toBe(0);
    expect(explain.json).toMatchObject({ verdict: 'queued_no_worker', runId: ids.queued });
  }, 120_000);

  it('an unknown run id is exit 3 and --json says unknown_run, for every command that takes an id (an empty one too)', async () => {
    const commands = ['status', 'events', 'explain', 'cancel', 'retry'];
    const results = await Promise.all([UNKNOWN, ''].flatMap((id) => commands.map((cmd) => ratchet([...remote, cmd, id]))));
    for (const r of results) {
      expect(r.code, r.stderr).toBe(3);
      expect(r.stdout).toBe('');
      expect(r.error).toMatchObject({ code: 'unknown_run' });
    }
  }, 120_000);

  it('retry a failed run (exit 0); retry or cancel what does not fit is exit 7; cancel a queued run says nothing was in flight', async () => {
    owe('cli-fail', 0);
    const retried = await ratchet([...remote, 'retry', ids.failed!]);
    expect(retried.code, retried.stderr).toBe(0);
    expect(retried.json).toMatchObject({ id: ids.failed, state: 'running', previousState: 'failed', stage: { seq: 1 } });
    await until('the retried run succeeded', async () => (await api.client.get(ids.failed!)).state === 'succeeded');
    const [again, cancelDone] = await Promise.all([ratchet([...remote, 'retry', ids.ok!]), ratchet([...remote, 'cancel', ids.ok!])]);
    expect(again.code).toBe(7);
    expect(again.error).toMatchObject({ code: 'not_retryable' });
    expect(cancelDone.code).toBe(7);
    expect(cancelDone.error).toMatchObject({ code: 'already_terminal' });
    const cancel = await ratchet(['--url', api.server.url, '--token', TOKEN, 'cancel', ids.queued!]);
    expect(cancel.code, cancel.stderr).toBe(0);
    expect(cancel.stdout).toMatch(/cancelled \(was queued\): cancelled before any of its stages was running/);
  }, 120_000);

  it('flags over environment: RATCHET_URL / RATCHET_TOKEN work alone, and a flag beats them; a refused token is exit 8; no server is exit 9', async () => {
    const env = { RATCHET_URL: api.server.url, RATCHET_TOKEN: TOKEN };
    const [fromEnv, flagWins, badToken, noServer] = await Promise.all([
      ratchet(['status', ids.ok!, '--json'], env),
      ratchet(['--url', api.server.url, 'status', ids.ok!, '--json'], { RATCHET_URL: 'http://127.0.0.1:9', RATCHET_TOKEN: TOKEN }),
      ratchet(['status', ids.ok!, '--json', '--token', 'not-the-token'], env),
      ratchet(['--url', 'http://127.0.0.1:9', 'status', ids.ok!, '--json']),
    ]);
    expect(fromEnv.code, fromEnv.stderr).toBe(0);
    expect(flagWins.code, flagWins.stderr).toBe(0);
    expect(badToken.code).toBe(8);
    expect(badToken.error).toMatchObject({ code: 'unauthorized' });
    expect(noServer.code).toBe(9);
    expect(noServer.error).toMatchObject({ code: 'network_error' });
  }, 120_000);

  it('run --wait submits through the server and shows each stage until the run ends (exit 0); a failed run is exit 5', async () => {
    const ok = await ratchet([...remote, 'run', 'echo', '--input', '{"key":"cli-run"}', '--wait', '--idempotency-key', 'cli-run-key']);
    expect(ok.code, ok.stderr).toBe(0);
    expect(ok.lines[0]).toMatchObject({ type: 'run_submitted', workflow: 'echo', created: true, idempotencyKey: 'cli-run-key' });
    expect(ok.lines.filter((l) => l.type === 'stage' && l.state === 'succeeded').map((l) => l.seq)).toEqual([1]);
    expect(ok.lines.at(-1)).toMatchObject({ type: 'run_finished', state: 'succeeded', result: { key: 'cli-run' } });
    owe('cli-run-fail', 5);
    const bad = await ratchet([...remote, 'run', 'flaky', '--input', '{"key":"cli-run-fail"}', '--wait']);
    expect(bad.code, bad.stderr).toBe(5);
    expect(bad.lines.at(-1)).toMatchObject({ type: 'run_finished', state: 'failed', error: { code: 'attempts_exhausted' } });
    const noWait = await ratchet([...remote, 'run', 'orphan', '--input', '{"key":"cli-nowait"}']);
    expect(noWait.code).toBe(0);
    expect(noWait.lines).toHaveLength(1);
    const badInput = await ratchet([...remote, 'run', 'echo', '--input', '{"key":1}']);
    expect(badInput.code).toBe(2);
    expect(badInput.error).toMatchObject({ code: 'invalid_input', path: 'input.key' });
  }, 120_000);
});

describe('run commands on the store directly (no --url)', () => {
  it('status and explain read the database; an unknown id is exit 3 with unknown_run', async () => {
    const [status, explain, unknown, list] = await Promise.all([
      ratchet([...local, 'status', ids.ok!]),
      ratchet([...local, 'explain', ids.ok!, '--workflows-dir', WORKFLOWS]),
      ratchet([...local, 'status', UNKNOWN]),
      ratchet(['--database-url', db.url, 'list', '--workflow', 'echo']),
    ]);
    expect(status.code, status.stderr).toBe(0);
    expect(status.json).toMatchObject({ id: ids.ok, state: 'succeeded' });
    expect(explain.code, explain.stderr).toBe(0);
    expect(explain.json).toMatchObject({ verdict: 'terminal', evidence: { state: 'succeeded' } });
    expect(unknown.code).toBe(3);
    expect(unknown.error).toMatchObject({ code: 'unknown_run' });
    expect(list.code, list.stderr).toBe(0);
    expect(list.stdout).toContain(ids.ok);
  }, 120_000);

  it('a database the URL names that does not exist is exit 4, database_unavailable, for migrate and status alike', async () => {
    const missing = new URL(db.url);
    missing.pathname = '/ratchet_cli_no_such_database';
    for (const cmd of [['migrate'], ['status', UNKNOWN]]) {
      const r = await ratchet(['--database-url', missing.toString(), '--json', ...cmd]);
      expect(r.code, r.stderr).toBe(4);
      expect(r.error).toMatchObject({ code: 'database_unavailable' });
      expect(r.error?.message).toContain('ratchet_cli_no_such_database');
    }
  }, 120_000);
});

describe('serve and dev', () => {
  it('serve refuses a non-loopback address without a token (exit 2, nothing opened)', async () => {
    const r = await ratchet([
      '--database-url',
      db.url,
      '--json',
      'serve',
      '--host',
      '0.0.0.0',
      '--port',
      '0',
      '--workflows-dir',
      WORKFLOWS,
    ]);
    expect(r.code).toBe(2);
    expect(r.error).toMatchObject({ code: 'invalid_input', message: expect.stringMatching(/without a token/) });
  }, 60_000);

  it('dev: embedded database, a worker and the API in one process; SIGTERM stops it (exit 0)', async () => {
    const child = spawn(
      process.execPath,
      [
        'bin/ratchet.mjs',
        'dev',
        '--json',
        '--port',
        '0',
        '--data-dir',
        join(tmp, 'dev-data'),
        '--workflows-dir',
        WORKFLOWS,
        '--token',
        TOKEN,
      ],
      { cwd: ROOT, env: { ...process.env, DATABASE_URL: '', RATCHET_URL: '', REDIS_URL: '' }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      err += d.toString();
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    try {
      const ready = await until('dev listening', async () => out.split('\n').find((l) => l.includes('api_listening')), 60_000).catch(() => {
        throw new Error(`dev did not start: ${err}`);
      });
      const info = JSON.parse(ready);
      expect(info).toMatchObject({
        type: 'api_listening',
        auth: true,
        backend: 'pglite',
        worker: { classes: expect.arrayContaining(['quick', 'long']) },
      });
      const client = createClient({ baseUrl: info.url, token: TOKEN });
      const { id } = await client.submit('echo', { key: 'dev-1' });
      const outcome = await client.wait(id, { deadline: '60s', initialInterval: 100 });
      expect(outcome).toMatchObject({ outcome: 'succeeded', result: { key: 'dev-1' } });
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  }, 120_000);
});
