import { describe, expect, it } from 'vitest';
import type { RunView } from '../../src/engine.js';
import { watchRun, type StageView } from '../../src/cli/run/watch.js';

const stage = (seq: number, state: StageView['state'], attempt: number): StageView => ({
  seq,
  name: `s${seq}`,
  tool: `t${seq}`,
  state,
  attempt,
  fence: attempt ? String(seq * 10 + attempt) : null,
  leaseUntil: null,
  heartbeatAt: null,
  lastError: null,
  idempotencyKey: `k${seq}`,
  effectKey: null,
  deps: seq > 1 ? [seq - 1] : [],
});
const view = (state: RunView['state'], stages: StageView[]): RunView => ({
  id: 'r',
  workflow: 'w',
  state,
  stages,
  result: null,
  error: null,
  deadline: null,
  createdAt: new Date(0),
  finishedAt: null,
});

/** getRun answering a scripted sequence of reads (the last one repeats). */
const script = (reads: RunView[]) => {
  let i = 0;
  return async () => reads[Math.min(i++, reads.length - 1)]!;
};

describe('watchRun', () => {
  it('reports each stage once per (state, attempt), skips pending ones, and ends on a terminal run', async () => {
    const seen: string[] = [];
    const outcome = await watchRun(
      script([
        view('queued', [stage(1, 'queued', 0), stage(2, 'pending', 0)]),
        view('running', [stage(1, 'running', 1), stage(2, 'pending', 0)]),
        view('running', [stage(1, 'running', 1), stage(2, 'pending', 0)]),
        view('running', [stage(1, 'queued', 1), stage(2, 'pending', 0)]),
        view('running', [stage(1, 'succeeded', 2), stage(2, 'running', 1)]),
        view('succeeded', [stage(1, 'succeeded', 2), stage(2, 'succeeded', 1)]),
      ]),
      'r',
      { intervalMs: 10, timeoutMs: 5000, onStage: (s) => seen.push(`${s.seq}:${s.state}:${s.attempt}`) },
    );
    expect(outcome.kind).toBe('finished');
    expect(seen).toEqual(['1:queued:0', '1:running:1', '1:queued:1', '1:succeeded:2', '2:running:1', '2:succeeded:1']);
  });

  it('stops at the timeout, leaving the run as it is', async () => {
    const outcome = await watchRun(script([view('running', [stage(1, 'running', 1)])]), 'r', {
      intervalMs: 10,
      timeoutMs: 50,
      onStage: () => {},
    });
    expect(outcome).toMatchObject({ kind: 'timeout', run: { state: 'running' } });
  });

  it('stops when interrupted', async () => {
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 30);
    const outcome = await watchRun(script([view('running', [])]), 'r', {
      intervalMs: 10_000,
      timeoutMs: 60_000,
      onStage: () => {},
      signal: ac.signal,
    });
    expect(outcome.kind).toBe('interrupted');
  });

  it('an unknown run is an error, not a wait', async () => {
    await expect(watchRun(async () => null, 'r', { intervalMs: 10, timeoutMs: 100, onStage: () => {} })).rejects.toThrow(/vanished/);
  });
});
