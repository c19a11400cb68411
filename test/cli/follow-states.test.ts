import { describe, expect, it } from 'vitest';
import type { EventJson } from '../../src/client/watch.js';
import { stageStateOf } from '../../src/cli/run/follow.js';

/**
 * The `stage` lines of `ratchet watch --stages` and `run --wait` follow the events: every state a stage can be in is
 * shown when it begins, waits and skips included (not left as `running`, the last claim's word).
 */
const ev = (type: string, data: unknown = null): EventJson =>
  ({ id: '1', runId: 'r', stageId: '5', type, fence: null, attempt: 1, at: new Date(0).toISOString(), data }) as EventJson;

describe('stageStateOf', () => {
  const cases: [string, unknown, string | null][] = [
    ['job_claimed', null, 'running'],
    ['stage_succeeded', null, 'succeeded'],
    ['stage_failed', { error: {} }, 'failed'],
    ['stage_skipped', null, 'skipped'],
    ['stage_waiting', null, 'waiting'], // a child run or a map's items
    ['wait_started', { kind: 'sleep' }, 'waiting'],
    ['wait_started', { kind: 'signal' }, 'waiting'],
    ['approval_requested', null, 'awaiting_approval'],
    ['approval_granted', {}, 'queued'],
    ['wait_ended', { kind: 'sleep', outcome: 'woken' }, 'queued'],
    ['wait_ended', { kind: 'signal', outcome: 'timed_out' }, 'queued'],
    ['wait_ended', { kind: 'signal', outcome: 'signalled' }, null], // stage_succeeded follows
    ['wait_ended', { kind: 'approval', outcome: 'timed_out' }, null], // stage_failed follows
    ['wait_ended', { kind: 'sleep', outcome: 'cancelled' }, null], // stage_cancelled follows
    ['stage_duration_exceeded', { nextState: 'queued' }, 'queued'],
    ['stage_duration_exceeded', { nextState: 'failed' }, 'failed'],
    ['stage_cancelled', {}, 'cancelled'],
    ['heartbeat_ok', null, null],
  ];
  for (const [type, data, state] of cases) {
    it(`${type} ${JSON.stringify(data)} -> ${state}`, () => {
      expect(stageStateOf(ev(type, data))).toBe(state);
    });
  }
});
