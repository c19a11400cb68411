import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pino, { type Logger } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { InvalidDefinitionError, PermanentError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { loadWorkflows } from '../../src/definitions/loader.js';
import type { ClaimedStage } from '../../src/store/index.js';
import { Attempt } from '../../src/worker/attempt.js';
import type { EventWriter } from '../../src/worker/event-writer.js';
import type { ToolInvocation } from '../../src/worker/executor.js';
import { createThreadRunner } from '../../src/worker/thread-runner.js';
import { cpuThreadWorkflow } from '../fixtures/isolation-workflows/isolation.js';

/**
 * isolation: 'thread' (issue 3): a CPU-bound tool in a worker thread keeps its lease; the same
 * work on the main thread blocks the lease keeper past the lease, and its late finish is
 * rejected, never stored. Tool class timing: lease 3 s, heartbeat 1 s, jitter 200 ms.
 */
const workflowsDir = fileURLToPath(new URL('../fixtures/isolation-workflows/', import.meta.url));
const TERMINAL = ['succeeded', 'failed', 'cancelled', 'expired'];
/** Per test: an embedded database starts slowly on a loaded 2-core machine, and two tests spin 7 s. */
const SLOW = 120_000;

const tmpDirs: string[] = [];
afterAll(() => {
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
});

/** A quiet logger that keeps its lines (pino JSON) for assertions. */
function captureLogger(level = 'debug'): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const logger = pino(
    { level },
    {
      write: (line: string) => {
        lines.push(JSON.parse(line) as Record<string, unknown>);
      },
    },
  );
  return { logger, lines };
}

async function until<T>(
  what: string,
  timeoutMs: number,
  probe: () => Promise<T | null | undefined | false> | T | null | undefined | false,
): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function settled(r: Ratchet, id: string, timeoutMs = 60_000): Promise<RunView> {
  return until(`run ${id} to settle`, timeoutMs, async () => {
    const run = await r.getRun(id);
    return run && TERMINAL.includes(run.state) ? run : null;
  });
}

const types = (events: { type: string }[]) => events.map((e) => e.type);

describe("isolation: 'thread'", () => {
  it(
    'a CPU-bound tool in a thread keeps its lease past several heartbeats and completes on attempt 1',
    async () => {
      const { logger, lines } = captureLogger();
      const r = await createRatchet({ dataDir: ':memory:', workflowsDir, logger });
      try {
        const w = r.worker({ classes: ['cpu_thread'] });
        await w.start();
        const { id } = await r.submit('cpu-thread', { ms: 7000 });
        const run = await settled(r, id);
        expect(run.state).toBe('succeeded');
        const stage = run.stages[0]!;
        expect(stage.attempt).toBe(1);
        const result = run.result as {
          attempt: number;
          fence: string;
          mainThread: boolean;
          threadId: number;
          spunMs: number;
          runId: string;
          stageId: string;
          idempotencyKey: string;
        };
        expect(result).toMatchObject({ attempt: 1, fence: stage.fence, mainThread: false, runId: id });
        expect(result.threadId).toBeGreaterThan(0);
        expect(result.spunMs).toBeGreaterThanOrEqual(7000); // more than twice the 3 s lease, without yielding once

        const events = await r.events(id);
        expect(types(events).filter((t) => t === 'job_claimed')).toHaveLength(1);
        expect(types(events)).not.toContain('lease_reclaimed');
        expect(types(events)).not.toContain('result_rejected');
        expect(types(events)).not.toContain('ownership_unknown');
        expect(new Set(events.map((e) => e.fence).filter((f) => f !== null))).toEqual(new Set([stage.fence]));
        expect(w.ended).toMatchObject({ succeeded: 1, rejected: 0, abandoned: 0 });

        // The keeper went on extending while the thread spun (the main loop stayed free).
        const extended = lines.filter((l) => l.event === 'heartbeat_ok' && l.runId === id);
        expect(extended.length).toBeGreaterThanOrEqual(5);
        // ctx.log and ctx.heartbeat in the thread reach the attempt's logger, with its bindings.
        expect(lines.find((l) => l.event === 'spin_done')).toMatchObject({ thread: true, runId: id, fence: stage.fence, level: 30 });
        expect(lines.find((l) => l.event === 'tool_heartbeat')).toMatchObject({ runId: id, details: { half: true } });
      } finally {
        await r.close();
      }
    },
    SLOW,
  );

  it(
    'without isolation, a tool that blocks the loop longer than its lease never writes a stale result; the stage still completes',
    async () => {
      const r = await createRatchet({ dataDir: ':memory:', workflowsDir, logger: silentLogger() });
      try {
        const w = r.worker({ classes: ['cpu_inline'] });
        await w.start();
        const { id } = await r.submit('cpu-inline', { ms: 7000 }); // attempt 1 only; attempt 2+ returns at once
        const run = await settled(r, id);
        expect(run.state).toBe('succeeded');
        const stage = run.stages[0]!;
        expect(stage.attempt).toBe(2);
        expect(run.result).toEqual({ attempt: 2, fence: stage.fence, mainThread: true });

        const events = await r.events(id);
        const rejected = events.filter((e) => e.type === 'result_rejected');
        expect(rejected).toHaveLength(1);
        // Attempt 1's token was refused. The event's `attempt` is the row's when the finish was refused: 1, or 2 when the
        // reclaim came between the light finish statement (which takes no stale row) and the full one that refused it.
        const claims = events.filter((e) => e.type === 'job_claimed' || e.type === 'lease_reclaimed'); // its only stage's claims
        expect(claims.map((e) => e.attempt)).toEqual([1, 2]);
        expect(rejected[0]!.fence).toBe(claims[0]!.fence);
        expect(BigInt(rejected[0]!.fence!)).toBeLessThan(BigInt(stage.fence!));
        expect(JSON.stringify(rejected[0]!.data)).not.toContain('mainThread'); // a hash, never the payload
        expect(types(events)).toContain('lease_reclaimed');
        const succeeded = events.filter((e) => e.type === 'stage_succeeded');
        expect(succeeded).toHaveLength(1);
        expect(succeeded[0]!.fence).toBe(stage.fence);
        expect(w.ended.rejected).toBe(1);
        expect(w.ended.succeeded).toBe(1);
      } finally {
        await r.close();
      }
    },
    SLOW,
  );

  it(
    'beginEffect in a thread refuses synchronously once the attempt is aborted (run cancelled while the tool is busy)',
    async () => {
      const dir = mkdtempSync(join(tmpdir(), 'ratchet-isolation-'));
      tmpDirs.push(dir);
      const runner = createThreadRunner({ abandonGraceMs: 30_000 });
      const r = await createRatchet({ dataDir: ':memory:', workflowsDir, logger: silentLogger(), threadRunner: runner });
      try {
        const w = r.worker({ classes: ['cpu_thread'] });
        await w.start();
        // The tool blocks its thread 5 s, so the abort message cannot be read before its gate.
        const { id } = await r.submit('effect-after-cancel', { ms: 5000, dir });
        await until('the tool to start in its thread', 20_000, () => existsSync(join(dir, 'started')));
        expect((await r.cancel(id))?.cancelled).toBe(true);
        const report = await until(
          "the tool's report",
          20_000,
          () =>
            existsSync(join(dir, 'report.json')) && (JSON.parse(readFileSync(join(dir, 'report.json'), 'utf8')) as Record<string, unknown>),
        );

        expect(report.began).toBe(false);
        expect(report.signalAbortedAtGate).toBe(false); // refused by the shared memory, not by the message
        expect(report.gate).toMatchObject({ name: 'AttemptAbortedError', code: 'cancelled' });
        // The message came after: ctx.signal aborted with an error carrying the reason's code.
        expect(report.signal).toEqual({ aborted: true, name: 'AttemptAbortedError', code: 'cancelled', isError: true });

        const run = await r.getRun(id);
        expect(run?.state).toBe('cancelled');
        const events = await r.events(id);
        expect(types(events)).not.toContain('tool_request_started');
        expect(types(events)).not.toContain('stage_succeeded');
        expect(w.ended.abandoned).toBe(1);
        expect(runner.stats().threads).toBeGreaterThanOrEqual(1);
      } finally {
        await r.close();
        await runner.close(); // a runner passed in is the caller's to close
      }
      expect(runner.stats()).toEqual({ threads: 0, busy: 0 });
    },
    SLOW,
  );

  it(
    'errors thrown in a thread keep their name, message, code and class (PermanentError is not retried, TransientError is)',
    async () => {
      const r = await createRatchet({ dataDir: ':memory:', workflowsDir, logger: silentLogger() });
      try {
        const w = r.worker({ classes: ['cpu_thread'] });
        await w.start();
        const permanent = await r.submit('thread-errors', { mode: 'permanent' });
        const transient = await r.submit('thread-errors', { mode: 'transient_once' });
        const plain = await r.submit('thread-errors', { mode: 'plain' });

        const p = await settled(r, permanent.id);
        expect(p.state).toBe('failed');
        expect(p.stages[0]!.attempt).toBe(1);
        expect(p.error).toMatchObject({
          code: 'no_such_invoice',
          name: 'PermanentError',
          kind: 'permanent',
          message: 'invoice 42 does not exist',
        });

        const t = await settled(r, transient.id);
        expect(t.state).toBe('succeeded');
        expect(t.result).toEqual({ attempt: 2 });
        const retry = (await r.events(transient.id)).find((e) => e.type === 'retry_scheduled');
        expect(retry?.data).toMatchObject({ error: { code: 'upstream_503', name: 'TransientError', kind: 'transient' } });

        const q = await settled(r, plain.id);
        expect(q.state).toBe('failed');
        expect(q.stages[0]!.attempt).toBe(3);
        expect(q.error).toMatchObject({
          code: 'attempts_exhausted',
          lastError: { code: 'plain_code', name: 'RangeError', message: 'plain failure', kind: 'unknown' },
        });
      } finally {
        await r.close();
      }
    },
    SLOW,
  );

  it(
    'an effect started in a thread is recorded; the unknown outcome is reconciled in a thread before the next attempt',
    async () => {
      const r = await createRatchet({ dataDir: ':memory:', workflowsDir, logger: silentLogger() });
      try {
        const w = r.worker({ classes: ['cpu_thread'] });
        await w.start();
        const { id } = await r.submit('thread-reconcile', { invoice: 'inv-7' });
        const run = await settled(r, id);
        expect(run.state).toBe('succeeded');
        expect(run.result).toEqual({ from: 'reconcile', attempt: 2, mainThread: false });
        const events = await r.events(id);
        const started = events.filter((e) => e.type === 'tool_request_started');
        expect(started).toHaveLength(1);
        expect(started[0]).toMatchObject({ attempt: 1, data: { requestId: 'create:inv-7' } });
        expect(events.find((e) => e.type === 'retry_scheduled')?.data).toMatchObject({
          error: { code: 'connection_reset', kind: 'transient' },
        });
        expect(events.find((e) => e.type === 'outcome_unknown')).toMatchObject({ attempt: 2 });
        expect(events.find((e) => e.type === 'reconciled')).toMatchObject({ attempt: 2, data: { done: true } });
      } finally {
        await r.close();
      }
    },
    SLOW,
  );

  it(
    "a thread's beginEffect checks the shared confirmation deadline itself; a tool that ignores a final abort loses its thread after the grace",
    async () => {
      const workflow = (await loadWorkflows(workflowsDir)).find((wf) => wf.name === 'gate-twice')!;
      const tool = workflow.steps[0]!.tool;
      const runner = createThreadRunner({ abandonGraceMs: 300 });
      const pushed: { type: string; data?: unknown }[] = [];
      const events = { push: (e: { type: string; data?: unknown }) => pushed.push(e) } as unknown as EventWriter;
      const invocation = (confirmedForMs: number, after: number) => {
        const stage = {
          id: 's-1',
          runId: 'r-1',
          fence: '41',
          attempt: 1,
          timeoutMs: 30_000,
          confirmedUntil: performance.now() + confirmedForMs,
          leaseUntil: new Date(),
        } as ClaimedStage;
        const attempt = new Attempt(stage, 1000, events, silentLogger());
        attempt.end(); // no deadline timer on this side: as if its loop were blocked, only the shared deadline can refuse
        const ctx = {
          signal: attempt.signal,
          fence: stage.fence,
          idempotencyKey: 'k',
          attempt: 1,
          runId: stage.runId,
          stageId: stage.id,
          heartbeat: () => {},
          beginEffect: (id: string) => attempt.beginEffect(id),
          log: silentLogger(),
        };
        return { attempt, inv: { tool, workflow, input: { after }, ctx, attempt } satisfies ToolInvocation };
      };
      try {
        // Warm the thread (tsx, the workflow file), so the timed call below starts at once.
        const warm = invocation(60_000, 0);
        expect(await runner.run(warm.inv)).toEqual({ first: 'ok', second: 'ok', abortedAtSecond: false });
        pushed.length = 0;

        const { attempt, inv } = invocation(1000, performance.timeOrigin + performance.now() + 1500);
        expect(await runner.run(inv)).toEqual({ first: 'ok', second: 'ownership_unknown', abortedAtSecond: false });
        expect(runner.stats()).toEqual({ threads: 1, busy: 0 }); // one thread, reused
        // 'a' was recorded; 'b' was refused, and the thread told this side, which aborted and logged ownership_unknown.
        expect(pushed.map((e) => e.type)).toEqual(['tool_request_started', 'ownership_unknown']);
        expect(pushed[0]!.data).toEqual({ requestId: 'a' });
        expect(attempt.abortReason).toBe('ownership_unknown');
        pushed.length = 0;

        // A final abort (here: cancelled) with a tool that never yields: its thread is terminated after the grace.
        const stuck = invocation(60_000, performance.timeOrigin + performance.now() + 60_000);
        const pending = runner.run(stuck.inv).then(
          () => null,
          (e: unknown) => e,
        );
        await until('the stuck tool to start', 10_000, () => pushed.some((e) => e.type === 'tool_request_started'));
        const t0 = performance.now();
        stuck.attempt.abort('cancelled', 'the run was cancelled');
        expect(await pending).toMatchObject({ code: 'thread_terminated' });
        expect(performance.now() - t0).toBeGreaterThanOrEqual(250);
        expect(runner.stats()).toEqual({ threads: 0, busy: 0 });
      } finally {
        await runner.close();
      }
      expect(runner.stats().threads).toBe(0);
    },
    SLOW,
  );

  it(
    'a thread-isolated tool of a workflow defined in code (no sourceFile) is refused clearly',
    async () => {
      expect(cpuThreadWorkflow.sourceFile).toBeUndefined();
      const r = await createRatchet({ dataDir: ':memory:', workflows: [cpuThreadWorkflow], logger: silentLogger() });
      try {
        let refused: unknown;
        try {
          r.worker();
        } catch (err) {
          refused = err;
        }
        expect(refused).toBeInstanceOf(InvalidDefinitionError);
        expect((refused as Error).message).toMatch(
          /workflow "cpu-thread" runs tool "spin_thread" of class "cpu_thread" with isolation 'thread', but the workflow has no sourceFile/,
        );
        expect((refused as InvalidDefinitionError).details).toMatchObject({ reason: 'thread_source_unknown' });
      } finally {
        await r.close();
      }

      // The runner itself, given such a workflow (a worker built without the engine's check), fails the attempt permanently.
      const runner = createThreadRunner();
      try {
        const step = cpuThreadWorkflow.steps[0]!;
        const inv = {
          tool: step.tool,
          workflow: cpuThreadWorkflow,
          input: { ms: 1 },
          ctx: {} as ToolInvocation['ctx'],
          attempt: {} as Attempt,
        };
        const err = await runner.run(inv).then(
          () => null,
          (e: unknown) => e,
        );
        expect(err).toBeInstanceOf(PermanentError);
        expect(err).toMatchObject({ code: 'thread_source_unknown' });
        expect(runner.stats().threads).toBe(0);
      } finally {
        await runner.close();
      }
    },
    SLOW,
  );
});
