import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { invoiceAgentScript } from '../../examples/invoice-agent-script.js';
import { startScriptedModel } from '../../src/agent/scripted-model.js';
import { createRatchet } from '../../src/index.js';
import { silentLogger } from '../../src/logger.js';
import invoiceAgent from '../../workflows/invoice-agent.js';

/**
 * `npm start` as a new user runs it: `node --import tsx examples/agent-demo.ts` in a child
 * process with no model configured (OPENAI_BASE_URL / OPENAI_API_KEY unset: the scripted model),
 * no DATABASE_URL (the embedded store, in a temp directory of this test) and no services; then
 * with OPENAI_BASE_URL and OPENAI_API_KEY set, as against a real model (here an endpoint the
 * test serves, which counts what it is asked).
 */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'ratchet-agent-demo-test-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the demo; `onLine` sees each stdout line as it is printed (to act as the person would). */
function npmStart(
  args: string[],
  env: NodeJS.ProcessEnv,
  onLine?: (line: string, child: ReturnType<typeof spawn>) => void,
): Promise<Result> {
  return new Promise((resolve, reject) => {
    const base = { ...process.env };
    for (const name of [
      'OPENAI_BASE_URL',
      'OPENAI_API_KEY',
      'RATCHET_MODEL',
      'DATABASE_URL',
      'REDIS_URL',
      'RATCHET_DATA_DIR',
      'RATCHET_DEMO_DATA_DIR',
      'RATCHET_EXAMPLE_SERVICES_URL',
      'SERVICES_DATABASE_URL',
      'RATCHET_LOG_LEVEL',
      'RATCHET_DEMO_PROGRESS_MS',
    ])
      delete base[name];
    const child = spawn(process.execPath, ['--import', 'tsx', 'examples/agent-demo.ts', ...args], {
      cwd: ROOT,
      env: { ...base, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    let partial = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
      partial += d.toString();
      const lines = partial.split('\n');
      partial = lines.pop()!;
      for (const line of lines) onLine?.(line, child);
    });
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the demo did not exit; stdout: ${stdout}\nstderr: ${stderr}`));
    }, 170_000);
    child.on('error', reject);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** The CLI command the demo prints for the stage awaiting approval, and its parts. */
const CLI_LINE = /^ {4}node bin\/ratchet\.mjs approve (\S+) --stage (\d+) --url (http:\/\/127\.0\.0\.1:\d+) --token (demo-[0-9a-f]{24})$/m;

/** Runs `node bin/ratchet.mjs <args>` as a person types it. */
function cli(args: string[]): Promise<Result> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['bin/ratchet.mjs', ...args], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    child.on('error', reject);
    child.on('exit', (code) => resolve({ code, stdout, stderr }));
  });
}

/** The stage lines, as "seq tool state attempt fence". */
const stageLines = (stdout: string) =>
  [...stdout.matchAll(/^ {2}stage (\d+) (\S+)\s+(\S+)\s+attempt (\d+)\s+fence (\S+)/gm)].map((m) => ({
    seq: Number(m[1]),
    tool: m[2]!,
    state: m[3]!,
    attempt: Number(m[4]),
    fence: m[5]!,
  }));

describe('npm start (examples/agent-demo.ts)', () => {
  it('runs the invoice agent against the scripted model on the embedded store: live stages, the answer, one case', async () => {
    const dataDir = join(tmp, 'kept');
    const r = await npmStart([], { RATCHET_DEMO_DATA_DIR: dataDir });
    expect(r.code, `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`).toBe(0);
    expect(r.stdout).toMatch(/scripted OpenAI-compatible server at http:\/\/127\.0\.0\.1:\d+\/v1/);
    expect(r.stdout).toContain(`embedded PGlite at ${dataDir}`);
    expect(existsSync(join(dataDir, 'pg'))).toBe(true);

    // create_case waited for a person: the stage line, the command and the HTTP call that decide it, then the demo's decision through that call.
    const runId = /^run (\S+): "/m.exec(r.stdout)?.[1];
    const api = /^ {2}api {7}(http:\/\/127\.0\.0\.1:\d+) \(bearer token (demo-[0-9a-f]{24})\): where a person approves$/m.exec(r.stdout);
    expect(api).not.toBeNull();
    const command = CLI_LINE.exec(r.stdout);
    expect(command?.slice(1)).toEqual([runId, expect.stringMatching(/^\d+$/), api![1], api![2]]);
    const stageId = command![2]!;
    expect(r.stdout).toContain(
      `    curl -X POST -H 'Authorization: Bearer ${api![2]}' ${api![1]}/v1/runs/${runId}/stages/${stageId}/approve\n`,
    );
    expect(r.stdout).toMatch(
      /^ {2}approving it now through that API call, as a person would \(npm start -- --ask waits for you instead\)$/m,
    );
    expect(r.stdout).toMatch(/^ {2}decided: create_case approved by token:[0-9a-f]{12} \(npm start\): queued, it runs once$/m);
    expect(r.stdout).not.toContain('waiting for your decision');

    // Each stage as it advanced, ending succeeded, in order: model, search, model, extract, model, create_case, model.
    const stages = stageLines(r.stdout);
    expect(stages).toContainEqual({
      seq: 6,
      tool: 'create_case',
      state: 'awaiting_approval',
      attempt: 1,
      fence: expect.stringMatching(/^\d+$/),
    });
    const finalLines = stages.filter((s) => s.state === 'succeeded');
    expect(finalLines.map((s) => [s.seq, s.tool])).toEqual([
      [1, 'model'],
      [2, 'search'],
      [3, 'model'],
      [4, 'extract_fields'],
      [5, 'model'],
      [6, 'create_case'],
      [7, 'model'],
    ]);
    // The approved call is claimed again once approved (attempt 2); every other stage ran once.
    for (const s of finalLines)
      expect(s).toMatchObject({ attempt: s.tool === 'create_case' ? 2 : 1, fence: expect.stringMatching(/^\d+$/) });
    expect(new Set(finalLines.map((s) => s.fence)).size).toBe(7); // a fencing token per attempt
    // Live: the scripted model thinks for a while, so its stages are also seen running.
    expect(stages.some((s) => s.tool === 'model' && s.state === 'running')).toBe(true);

    // The final answer, built from the statement's real figures and the case the service filed.
    const answer = /^answer: (.+)$/m.exec(r.stdout)?.[1];
    expect(answer).toMatch(/^Invoice inv-42 from .+: total [A-Z]{3} \d+\.\d{2}, paid .+ I filed reconciliation case (case-[0-9a-f]{8}) /);
    const caseId = /case (case-[0-9a-f]{8})/.exec(answer!)?.[1];

    // Exactly one effect at the fenced receiver, under the key derived from the invoice.
    expect(r.stdout).toMatch(/^cases at the case service: 1$/m);
    const cases = [...r.stdout.matchAll(/^ {2}(case-[0-9a-f]{8}) {2}invoice (\S+) {2}(\S+) {2}key (\S+) {2}fence (\d+)$/gm)];
    expect(cases).toHaveLength(1);
    expect(cases[0]!.slice(1, 5)).toEqual([caseId, 'inv-42', 'discrepancy', 'invoice:inv-42:create-case']);
    expect(cases[0]![5]).toBe(finalLines.find((s) => s.tool === 'create_case')!.fence);

    expect(r.stdout).toMatch(
      /^ok: run succeeded in [\d.]+s — 4 model calls \(4 requests to the scripted model\), 3 tool stages, 1 approval \(granted\), no retries, 1 case filed \(1 POST to the receiver\)$/m,
    );

    // The kept store: the request and the decision, made through the API by the demo's token, in the run's history.
    const kept = await createRatchet({ dataDir, workflows: [invoiceAgent], logger: silentLogger() });
    try {
      const events = await kept.events(runId!);
      const of = (type: string) => events.filter((e) => e.type === type && e.stageId === stageId);
      expect(of('approval_requested')).toHaveLength(1);
      expect(of('approval_granted').map((e) => e.data)).toEqual([
        expect.objectContaining({ decidedBy: expect.stringMatching(/^token:[0-9a-f]{12}$/), actor: 'npm start', edited: false }),
      ]);
    } finally {
      await kept.close();
    }
  }, 180_000);

  it('an invoice that does not exist: the model says so, no case is filed, and the temp data directory is removed', async () => {
    const r = await npmStart(['missing-7'], {});
    expect(r.code, `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`).toBe(0);
    expect(r.stdout).toMatch(/^answer: There is no statement for invoice missing-7; I filed no case\.$/m);
    expect(r.stdout).toMatch(/^cases at the case service: 0$/m);
    expect(r.stdout).not.toContain('awaiting_approval');
    expect(r.stdout).not.toMatch(CLI_LINE);
    expect(r.stdout).toMatch(/, 1 tool stage, no approval asked, no retries, 0 cases filed \(0 POSTs to the receiver\)$/m);
    expect(
      stageLines(r.stdout)
        .filter((s) => s.state === 'succeeded')
        .map((s) => s.tool),
    ).toEqual(['model', 'search', 'model']);
    const dir = /embedded PGlite at (\S+)/.exec(r.stdout)?.[1];
    expect(dir).toContain('ratchet-agent-demo-');
    expect(existsSync(dir!)).toBe(false);
  }, 180_000);

  it('with OPENAI_BASE_URL and OPENAI_API_KEY set, asks that endpoint for RATCHET_MODEL and starts no scripted server', async () => {
    const endpoint = await startScriptedModel({ script: invoiceAgentScript });
    try {
      const r = await npmStart(['inv-7'], { OPENAI_BASE_URL: endpoint.baseURL, OPENAI_API_KEY: 'sk-test', RATCHET_MODEL: 'test-model' });
      expect(r.code, `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`).toBe(0);
      expect(r.stdout).toContain(`  model     test-model at ${endpoint.baseURL}`);
      expect(r.stdout).not.toContain('scripted OpenAI-compatible server');
      expect(endpoint.requests).toHaveLength(4);
      expect(endpoint.requests.map((q) => q.model)).toEqual(Array(4).fill('test-model'));
      expect(endpoint.requests[0]!.tools?.map((t) => t.function.name)).toEqual(['search', 'extract_fields', 'create_case']);
      expect(r.stdout).toMatch(/^answer: Invoice inv-7 from /m);
      expect(r.stdout).toMatch(
        /^ok: run succeeded in [\d.]+s — 4 model calls, 3 tool stages, 1 approval \(granted\), no retries, 1 case filed \(1 POST to the receiver\)$/m,
      );
    } finally {
      await endpoint.close();
    }
  }, 180_000);

  it('--ask waits for the person: the printed CLI command approves it, the call runs once', async () => {
    let approval: Promise<Result> | undefined;
    const r = await npmStart(['--ask', 'inv-7'], {}, (line) => {
      const m = CLI_LINE.exec(line);
      if (m && !approval) approval = cli([...line.trim().split(' ').slice(2), '--by', 'Ana', '--json']);
    });
    expect(r.code, `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`).toBe(0);
    const decided = await approval!;
    expect(decided.code, decided.stderr).toBe(0);
    expect(JSON.parse(decided.stdout)).toMatchObject({ decision: 'approved', actor: 'Ana', stageId: CLI_LINE.exec(r.stdout)![2] });
    expect(r.stdout).toMatch(/^ {2}waiting for your decision \(Ctrl-C stops; the run would stay waiting\)\.\.\.$/m);
    expect(r.stdout).not.toContain('approving it now');
    expect(r.stdout).toMatch(/^ {2}decided: create_case approved by token:[0-9a-f]{12} \(Ana\): queued, it runs once$/m);
    expect(r.stdout).toMatch(/^cases at the case service: 1$/m);
    expect(r.stdout).toMatch(/, 3 tool stages, 1 approval \(granted\), no retries, 1 case filed \(1 POST to the receiver\)$/m);
  }, 180_000);

  it('--ask, rejected through the API call: nothing is filed, the model hears why and says so', async () => {
    let rejection: Promise<Response> | undefined;
    const r = await npmStart(['--ask'], {}, (line) => {
      const m = /^ {4}curl -X POST -H 'Authorization: Bearer (\S+)' (\S+)\/approve$/.exec(line);
      if (m && !rejection)
        rejection = fetch(`${m[2]}/reject`, {
          method: 'POST',
          headers: { authorization: `Bearer ${m[1]}`, 'content-type': 'application/json' },
          body: JSON.stringify({ reason: 'wrong vendor', by: 'Bo' }),
        });
    });
    expect(r.code, `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`).toBe(0);
    expect((await rejection!).status).toBe(200);
    expect(r.stdout).toMatch(
      /^ {2}decided: create_case rejected by token:[0-9a-f]{12} \(Bo\): "wrong vendor"; the model hears it as the tool's answer$/m,
    );
    expect(r.stdout).toMatch(
      /^answer: I did not file a case for invoice inv-42: it was rejected by Bo \(token:[0-9a-f]{12}\) \("wrong vendor"\)\.$/m,
    );
    expect(r.stdout).toMatch(/^cases at the case service: 0$/m);
    expect(
      stageLines(r.stdout)
        .filter((s) => s.tool === 'create_case')
        .map((s) => s.state),
    ).toEqual(['awaiting_approval', 'failed']);
    expect(r.stdout).toMatch(/, 3 tool stages, 1 approval \(rejected\), no retries, 0 cases filed \(0 POSTs to the receiver\)$/m);
  }, 180_000);

  it('--ask prints progress while it waits; Ctrl-C stops watching (exit 130) and the call never ran', async () => {
    let progress = 0;
    const r = await npmStart(['--ask'], { RATCHET_DEMO_PROGRESS_MS: '300' }, (line, child) => {
      if (
        /^ {2}still awaiting approval after \d+ s \(explain: awaiting_approval; nothing is leased meanwhile\)$/.test(line) &&
        ++progress === 2
      )
        child.kill('SIGINT');
    });
    expect(r.code, `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`).toBe(130);
    expect(progress).toBeGreaterThanOrEqual(2);
    expect(r.stdout).toMatch(/^interrupted: the run is left running$/m);
    expect(r.stdout).toMatch(/^cases at the case service: 0$/m);
    expect(r.stdout).not.toMatch(/decided:/);
  }, 180_000);
});
