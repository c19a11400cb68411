import { describe, expect, it } from 'vitest';
import { classifyWaiting } from '../../src/observability/classify.js';
import { explanationSchema } from '../../src/observability/explanation.js';
import type { RunRow, StageRow } from '../../src/store/index.js';

const now = new Date('2026-11-30T22:00:00Z');
const stage = (over: Partial<StageRow> = {}): StageRow => ({
  id: '7',
  seq: 2,
  name: 'sub',
  tool: '$workflow',
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
const run = (stages: StageRow[]): RunRow => ({
  id: 'r1',
  workflow: 'parent',
  definitionHash: 'h',
  input: {},
  state: 'running',
  deadline: null,
  priority: 0,
  idempotencyKey: null,
  result: null,
  error: null,
  createdAt: now,
  updatedAt: now,
  finishedAt: null,
  dbNow: now,
  stages,
});

describe('explain of a waiting stage', () => {
  it('waiting_for_child carries the child run and its own verdict', () => {
    const s = stage();
    const e = classifyWaiting(
      run([s]),
      s,
      {
        kind: 'child',
        childRunId: 'c1',
        workflow: 'child',
        childState: 'running',
        childVerdict: 'queued_no_worker',
        childSummary: 'stage 1 (x) waits: no worker has served class io',
      },
      now,
    );
    expect(explanationSchema.parse(e)).toEqual(e);
    expect(e).toMatchObject({
      verdict: 'waiting_for_child',
      stage: { state: 'waiting' },
      evidence: { childRunId: 'c1', childVerdict: 'queued_no_worker' },
    });
    expect(e.summary).toMatch(/waits for its child run c1 \(child\), which is running: stage 1 \(x\) waits: no worker/);
  });

  it('waiting_for_items counts the map items by state', () => {
    const s = stage({ name: 'each', tool: 'item', toolClass: 'slow' });
    const e = classifyWaiting(
      run([s]),
      s,
      { kind: 'items', states: ['succeeded', 'running', 'running', 'queued', 'failed'], maxParallel: 2 },
      now,
    );
    expect(explanationSchema.parse(e)).toEqual(e);
    expect(e.evidence).toEqual({ items: 5, open: 3, running: 2, succeeded: 1, failed: 1, maxParallel: 2 });
    expect(e.summary).toBe('stage 2 (each) waits for 3 of its 5 map items (at most 2 at once): 2 running, 1 succeeded, 1 failed');
  });
});
