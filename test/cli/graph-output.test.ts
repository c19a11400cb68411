import { describe, expect, it } from 'vitest';
import type { RunJson } from '../../src/api/schemas.js';
import { depNames, formatRun } from '../../src/cli/api/format.js';
import { createFollower } from '../../src/cli/run/follow.js';
import { jsonReporter, textReporter } from '../../src/cli/run/report.js';
import { watchRun, type StageView } from '../../src/cli/run/watch.js';
import type { RunView } from '../../src/engine.js';

/** `ratchet status` and `ratchet run` show the run graph: each stage's dependencies by step name (JSON: `deps`). */
const stage = (seq: number, name: string, state: string, deps: number[]) => ({
  id: String(seq),
  seq,
  name,
  tool: name,
  toolClass: 'io',
  state,
  attempt: state === 'pending' ? 0 : 1,
  maxAttempts: 3,
  fence: state === 'pending' ? null : String(seq),
  leaseUntil: null,
  heartbeatAt: null,
  availableAt: new Date(0).toISOString(),
  effectKey: null,
  lastError: null,
  deps,
});
// A fan-out of two and a join.
const run = {
  id: 'r1',
  workflow: 'digest',
  state: 'running',
  createdAt: new Date(0).toISOString(),
  finishedAt: null,
  deadline: null,
  stages: [
    stage(1, 'fetch', 'succeeded', []),
    stage(2, 'news', 'running', [1]),
    stage(3, 'blogs', 'running', [1]),
    stage(4, 'merge', 'pending', [2, 3]),
  ],
} as unknown as RunJson;

describe('the run graph in the CLI', () => {
  it('status: a deps column by step name', () => {
    const text = formatRun(run).split('\n');
    expect(text[1]).toMatch(/stage 1 fetch .* deps -$/);
    expect(text[2]).toMatch(/stage 2 news .* deps fetch/);
    expect(text[4]).toMatch(/stage 4 merge .* deps news,blogs/);
    expect(depNames([2, 3, 9], run.stages)).toEqual(['news', 'blogs', '9']);
  });

  it('run: stage lines (text and JSON) carry deps, from the watched run', async () => {
    const view = {
      id: 'r1',
      state: 'succeeded',
      stages: run.stages.map((s) => ({ ...s, state: 'succeeded', deps: s.deps })) as unknown as StageView[],
    } as RunView;
    const text: string[] = [];
    const json: string[] = [];
    const t = textReporter((l) => text.push(l));
    const j = jsonReporter((l) => json.push(l));
    await watchRun(async () => view, 'r1', {
      intervalMs: 1,
      timeoutMs: 1000,
      onStage: (s, r) => {
        t.stage('r1', s, depNames(s.deps, r.stages));
        j.stage('r1', s, depNames(s.deps, r.stages));
      },
    });
    expect(text[3]).toMatch(/stage 4 merge .* deps news,blogs/);
    expect(JSON.parse(json[3]!)).toMatchObject({ type: 'stage', name: 'merge', deps: ['news', 'blogs'] });
    expect(JSON.parse(json[0]!)).toMatchObject({ name: 'fetch', deps: [] });
  });

  it('run --url --wait: the follower shows deps too', async () => {
    const out: string[] = [];
    const f = createFollower({ json: true, write: (l) => out.push(l) }, async () => run, 'stages');
    await f.event({
      runId: 'r1',
      stageId: '4',
      type: 'job_claimed',
      attempt: 1,
      fence: '9',
      at: new Date(0).toISOString(),
      data: null,
    } as never);
    expect(JSON.parse(out[0]!)).toMatchObject({ seq: 4, state: 'running', deps: ['news', 'blogs'] });
  });

  it('run: two stages running at once are shown as they run, before either ends', async () => {
    const views = [
      { ...run, stages: run.stages.map((s) => (s.seq === 1 ? s : { ...s, state: 'pending' })) },
      run, // news and blogs both running
      { ...run, stages: run.stages.map((s) => (s.seq === 2 ? { ...s, state: 'succeeded' } : s)) },
      { ...run, state: 'succeeded', stages: run.stages.map((s) => ({ ...s, state: 'succeeded' })) },
    ] as unknown as RunView[];
    let i = 0;
    const text: string[] = [];
    const t = textReporter((l) => text.push(l));
    await watchRun(async () => views[Math.min(i++, views.length - 1)]!, 'r1', {
      intervalMs: 1,
      timeoutMs: 1000,
      onStage: (s, r) => t.stage('r1', s, depNames(s.deps, r.stages)),
    });
    const at = (re: RegExp) => text.findIndex((l) => re.test(l));
    const newsRunning = at(/stage 2 news .*running/);
    const blogsRunning = at(/stage 3 blogs .*running/);
    expect(newsRunning).toBeGreaterThan(-1);
    expect(blogsRunning).toBeGreaterThan(-1);
    const firstEnd = Math.min(at(/stage 2 news .*succeeded/), at(/stage 3 blogs .*succeeded/));
    expect(Math.max(newsRunning, blogsRunning)).toBeLessThan(firstEnd); // both shown running before either ended
    expect(text.filter((l) => / running/.test(l))).toHaveLength(2);
  });
});
