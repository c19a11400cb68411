import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { callsOf, owe, release } from '../api/fixtures.js';
import { startApi, TOKEN, until, type Api } from '../api/helpers.js';

/** `ratchet watch <id>` as a user types it: from a server's stream (--url) and from the database directly. */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
  lines: any[];
  error: any;
}
function ratchet(args: string[]): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const env = { ...process.env };
    for (const name of ['DATABASE_URL', 'RATCHET_DATA_DIR', 'RATCHET_URL', 'RATCHET_TOKEN', 'RATCHET_TOKENS', 'REDIS_URL'])
      delete env[name];
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
      const lines = stdout
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l));
      const errLine = stderr
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{"error"'))
        .at(-1);
      resolve({ code, stdout, stderr, lines, error: errLine ? JSON.parse(errLine).error : undefined });
    });
  });
}

let db: TestDatabase;
let api: Api;
beforeAll(async () => {
  db = await createTestDatabase('cli_watch');
  api = await startApi({ databaseUrl: db.url });
  await api.ratchet.worker({ classes: ['quick', 'long'], pollIntervalMs: 50 }).start();
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

describe('ratchet watch', () => {
  it('--url: follows a running run live to its end (exit 0), every event once, then watch_end', async () => {
    const { id } = await api.client.submit('gate', { key: 'cli-watch-live' });
    const watching = ratchet(['--url', api.server.url, '--token', TOKEN, '--json', 'watch', id]);
    await until('the gate stage running', async () => callsOf('gate', 'cli-watch-live').length > 0);
    await new Promise((r) => setTimeout(r, 500));
    release('cli-watch-live');
    const r = await watching;
    expect(r.code, r.stderr).toBe(0);
    const events = r.lines.filter((l) => l.type !== 'watch_end');
    expect(events.map((e) => e.id)).toEqual((await api.client.events(id)).events.map((e) => e.id));
    expect(r.lines.at(-1)).toMatchObject({
      type: 'watch_end',
      outcome: 'ended',
      state: 'succeeded',
      result: { key: 'cli-watch-live' },
      via: 'stream',
    });
  }, 120_000);

  it('from the database directly: a failed run is exit 5; --stages prints stage lines; an unknown run is exit 3; --timeout on a running run is exit 6', async () => {
    owe('cli-watch-fail', 5);
    const failed = await api.client.submit('flaky', { key: 'cli-watch-fail' });
    await until('the run to fail', async () => (await api.client.get(failed.id)).state === 'failed');
    const running = await api.client.submit('gate', { key: 'cli-watch-timeout' });
    const [f, stages, unknown, timeout] = await Promise.all([
      ratchet(['--database-url', db.url, '--json', 'watch', failed.id]),
      ratchet(['--database-url', db.url, '--json', 'watch', failed.id, '--stages']),
      ratchet(['--database-url', db.url, '--json', 'watch', '01890f4e-0000-7000-8000-00000000cafe']),
      ratchet(['--url', api.server.url, '--token', TOKEN, '--json', 'watch', running.id, '--timeout', '1s']),
    ]);
    expect(f.code, f.stderr).toBe(5);
    expect(f.lines.at(-2)).toMatchObject({ type: 'run_failed', runId: failed.id });
    expect(f.lines.at(-1)).toMatchObject({ type: 'watch_end', outcome: 'ended', state: 'failed', error: { code: 'attempts_exhausted' } });
    expect(stages.lines.filter((l) => l.type === 'stage').map((l) => `${l.seq}:${l.state}`)).toEqual([
      '1:running',
      '1:queued',
      '1:running',
      '1:failed',
    ]);
    expect(unknown.code).toBe(3);
    expect(unknown.error).toMatchObject({ code: 'unknown_run' });
    expect(timeout.code, timeout.stderr).toBe(6);
    expect(timeout.lines.at(-1)).toMatchObject({ type: 'watch_end', outcome: 'client_deadline_exceeded', state: 'running' });
    release('cli-watch-timeout');
  }, 120_000);

  it('--after past bigint (9999999999999999999) is exit 2 invalid_input at after, from a server and from the database', async () => {
    const { id } = await api.client.submit('echo', { key: 'cli-watch-after-past' });
    await until('the run to succeed', async () => (await api.client.get(id)).state === 'succeeded');
    const after = ['watch', id, '--after', '9999999999999999999', '--timeout', '5s'];
    const [viaUrl, viaDb, text] = await Promise.all([
      ratchet(['--url', api.server.url, '--token', TOKEN, '--json', ...after]),
      ratchet(['--database-url', db.url, '--json', ...after]),
      ratchet(['--database-url', db.url, ...after]),
    ]);
    for (const r of [viaUrl, viaDb]) {
      expect(r.code, r.stderr).toBe(2);
      expect(r.error).toMatchObject({ code: 'invalid_input', path: 'after', message: expect.stringContaining('--after') });
      expect(r.lines).toEqual([]);
    }
    expect(text.code, text.stderr).toBe(2);
    expect(text.stderr).toContain('--after must be an event id (at most 9223372036854775807)');
  }, 120_000);
});
