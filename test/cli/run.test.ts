import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { openStore } from '../../src/store/index.js';

/**
 * `ratchet run` as a user types it: `node bin/ratchet.mjs` in a child process, with a temp
 * --data-dir (the embedded store) and the example services started in-process
 * (--with-services). Asserts exit codes and what is printed.
 */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'ratchet-cli-run-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
let dirs = 0;
const freshDir = () => join(tmp, `data-${++dirs}`);

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
  lines: Record<string, unknown>[];
}

function ratchet(args: string[], env: NodeJS.ProcessEnv = {}): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const base = { ...process.env };
    for (const name of ['DATABASE_URL', 'RATCHET_DATA_DIR', 'RATCHET_EXAMPLE_SERVICES_URL', 'SERVICES_DATABASE_URL']) delete base[name];
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
    }, 100_000);
    child.on('error', reject);
    child.on('exit', (code) => {
      clearTimeout(timer);
      const lines = stdout
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      resolve({ code, stdout, stderr, lines });
    });
  });
}

describe('ratchet run', () => {
  it('runs reconcile-invoice to succeeded offline (--with-services), one JSON line per stage change, exit 0', async () => {
    const dataDir = freshDir();
    const r = await ratchet([
      '--data-dir',
      dataDir,
      'run',
      'reconcile-invoice',
      '--input',
      '{"invoiceId":"inv-42"}',
      '--with-services',
      '--json',
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.lines.length).toBe(r.stdout.trim().split('\n').length); // nothing but JSON lines on stdout
    const [services, submitted] = r.lines;
    expect(services).toMatchObject({ type: 'services_started', url: expect.stringMatching(/^http:\/\/127\.0\.0\.1:\d+$/) });
    expect(submitted).toMatchObject({ type: 'run_submitted', workflow: 'reconcile-invoice', created: true, runId: expect.any(String) });
    const runId = submitted!.runId as string;

    const stages = r.lines.filter((l) => l.type === 'stage');
    for (const s of stages)
      expect(s).toMatchObject({
        runId,
        seq: expect.any(Number),
        tool: expect.any(String),
        state: expect.any(String),
        attempt: expect.any(Number),
      });
    // Each stage is seen to end, in order, with its fence.
    const ends = stages.filter((s) => s.state === 'succeeded');
    expect(ends.map((s) => [s.seq, s.tool])).toEqual([
      [1, 'fetch_statement'],
      [2, 'extract_fields'],
      [3, 'file_case'],
    ]);
    expect(ends.every((s) => typeof s.fence === 'string')).toBe(true);

    const last = r.lines.at(-1)!;
    expect(last).toMatchObject({
      type: 'run_finished',
      runId,
      state: 'succeeded',
      error: null,
      result: { key: 'invoice:inv-42:create-case', replayed: false },
    });

    // The run is durable in the data directory, and the directory is free again.
    const store = await openStore({ dataDir });
    try {
      expect((await store.getRun(runId))?.state).toBe('succeeded');
    } finally {
      await store.close();
    }
  }, 120_000);

  it('a run that fails prints the error and exits 5 (text output)', async () => {
    const r = await ratchet([
      '--data-dir',
      freshDir(),
      'run',
      'reconcile-invoice',
      '--input',
      '{"invoiceId":"missing-7"}',
      '--with-services',
    ]);
    expect(r.code, r.stderr).toBe(5);
    expect(r.stdout).toMatch(/stage 1 fetch_statement\s+failed\s+attempt 1/);
    expect(r.stdout).toMatch(/run \S+ failed in/);
    expect(r.stdout).toContain('error: unknown_statement');
  }, 120_000);

  it('reads the input from @file', async () => {
    const file = join(tmp, 'report.json');
    writeFileSync(file, JSON.stringify({ reportId: 'q3', period: '2024-Q3', regions: ['emea'] }));
    const r = await ratchet(['--data-dir', ':memory:', 'run', 'publish-report', '--input', `@${file}`, '--with-services', '--json']);
    expect(r.code, r.stderr).toBe(0);
    expect(r.lines.at(-1)).toMatchObject({
      type: 'run_finished',
      state: 'succeeded',
      result: { reportId: 'q3', key: 'report:q3:publish' },
    });
  }, 120_000);

  describe('bad input: exit 2, a clear error, nothing persisted (not even the data directory)', () => {
    const refused = async (args: string[], message: RegExp) => {
      const dataDir = freshDir();
      const r = await ratchet(['--data-dir', dataDir, '--json', 'run', ...args]);
      expect(r.code, r.stderr).toBe(2);
      expect(r.stdout).toBe('');
      const error = JSON.parse(r.stderr.trim().split('\n').at(-1)!) as { error: { code: string; message: string } };
      expect(error.error.code).toBe('invalid_input');
      expect(error.error.message).toMatch(message);
      expect(existsSync(dataDir)).toBe(false);
    };

    it('input that is not JSON', () => refused(['reconcile-invoice', '--input', '{invoiceId: inv-42'], /not JSON/), 60_000);
    it('an unknown workflow', () => refused(['no-such-workflow', '--input', '{}'], /unknown workflow "no-such-workflow"/), 60_000);
    it(
      "input the workflow's schema refuses",
      () => refused(['reconcile-invoice', '--input', '{"invoiceId":""}'], /input\.invoiceId/),
      60_000,
    );
    it(
      'a missing input file',
      () => refused(['reconcile-invoice', '--input', `@${join(tmp, 'nope.json')}`], /cannot read the input file/),
      60_000,
    );
  });

  it('a usage error (missing workflow argument) exits 2', async () => {
    const r = await ratchet(['run']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/missing required argument 'workflow'/);
  }, 60_000);
});
