import { describe, expect, it } from 'vitest';
import { classifyWait } from '../../src/observability/classify-waits.js';
import { explanationSchema } from '../../src/observability/explanation.js';
import type { RunRow, StageRow } from '../../src/store/index.js';

const now = new Date('2026-12-01T03:00:00Z');
const ago = (ms: number) => new Date(now.getTime() - ms);
const later = (ms: number) => new Date(now.getTime() + ms);
const stage = (over: Partial<StageRow> = {}): StageRow => ({
  id: '7',
  seq: 2,
  name: 'payment',
  tool: '$signal',
  toolClass: '$control',
  state: 'waiting',
  ownerId: null,
  fence: '12',
  attempt: 1,
  maxAttempts: 4,
  leaseUntil: null,
  heartbeatAt: null,
  claimedAt: null,
  availableAt: now,
  idempotencyKey: 'k',
  effectKey: null,
  input: null,
  result: null,
  error: null,
  createdAt: now,
  updatedAt: now,
  finishedAt: null,
  ...over,
});
const run = (s: StageRow, deadline: Date | null = null): RunRow => ({
  id: 'r1',
  workflow: 'invoice',
  definitionHash: 'h',
  input: {},
  state: 'running',
  deadline,
  priority: 0,
  idempotencyKey: null,
  result: null,
  error: null,
  createdAt: now,
  updatedAt: now,
  finishedAt: null,
  dbNow: now,
  stages: [s],
});

describe('explain of a run that waits (issue 10): verdicts with since and timeout as evidence, by the database clock', () => {
  it('waiting_for_signal: since, timeout, how to send it; past its timeout: overdue', () => {
    const s = stage();
    const e = classifyWait(
      run(s),
      s,
      { kind: 'signal', signal: 'payment', since: ago(60_000), until: later(3_540_000), timeoutMs: 3_600_000 },
      now,
    );
    expect(explanationSchema.parse(e)).toEqual(e);
    expect(e).toMatchObject({
      verdict: 'waiting_for_signal',
      stage: { id: '7', state: 'waiting' },
      evidence: {
        signal: 'payment',
        since: ago(60_000).toISOString(),
        timeoutAt: later(3_540_000).toISOString(),
        timeoutMs: 3_600_000,
        waitingForMs: 60_000,
        overdueMs: null,
        onTimeout: 'fail',
      },
    });
    expect(e.summary).toMatch(/waits for signal "payment".*signal_timeout.*POST \/v1\/runs\/r1\/signals\/payment/);
    const late = classifyWait(
      run(s),
      s,
      { kind: 'signal', signal: 'payment', since: ago(70_000), until: ago(10_000), onTimeout: true },
      now,
    );
    expect(late.evidence).toMatchObject({ overdueMs: 10_000, onTimeout: 'on_timeout' });
    expect(late.summary).toMatch(/passed 10.0 s ago/);
  });

  it('awaiting_approval: the tool, since, the timeout (or none), and the command a person uses', () => {
    const s = stage({ id: '9', name: 'create_case', tool: 'create_case', toolClass: 'io', state: 'awaiting_approval' });
    const e = classifyWait(run(s), s, { kind: 'approval', since: ago(5_000), until: null }, now);
    expect(explanationSchema.parse(e)).toEqual(e);
    expect(e).toMatchObject({
      verdict: 'awaiting_approval',
      evidence: {
        tool: 'create_case',
        since: ago(5_000).toISOString(),
        timeoutAt: null,
        waitingForMs: 5_000,
        overdueMs: null,
        approveWith: 'ratchet approve r1 --stage 9',
      },
    });
    expect(e.summary).toMatch(/waits until someone decides/);
    const timed = classifyWait(run(s, ago(1)), s, { kind: 'approval', since: ago(5_000), until: later(1_000) }, now);
    expect(timed.summary).toMatch(/approval_timeout.*deadline has passed/);
    expect(timed.deadlinePassed).toBe(true);
  });

  it('sleeping_until: until, since, remaining (0 and overdue once due)', () => {
    const s = stage({ name: 'sleep', tool: '$sleep' });
    const e = classifyWait(run(s), s, { kind: 'sleep', since: ago(1_000), until: later(600_000) }, now);
    expect(explanationSchema.parse(e)).toEqual(e);
    expect(e).toMatchObject({
      verdict: 'sleeping_until',
      evidence: { until: later(600_000).toISOString(), since: ago(1_000).toISOString(), remainingMs: 600_000, overdueMs: null },
    });
    const due = classifyWait(run(s), s, { kind: 'sleep', since: ago(1_000), until: ago(500) }, now);
    expect(due.evidence).toMatchObject({ remainingMs: 0, overdueMs: 500 });
  });
});
