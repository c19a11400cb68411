import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeFinishRow, finishEncoded, openStore, type FinishRow, type Queryable, type Store } from '../../src/store/index.js';
import { setLightFinish } from '../../src/store/finish.js';
import { FINISH_LIGHT_SQL } from '../../src/store/finish-light.sql.js';
import { stageRows, stageSpecSchema } from '../../src/store/runs.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { spec } from './lease-suite.js';

/**
 * The light finish (finish-light.sql.ts) with its fallback to the full statement gives exactly the
 * database state the full statement alone gives: the same scenario runs on two databases, one with the
 * light statement on, one with it off, and their stages, runs, events (per run, in order, with their
 * payloads) and the verdicts are compared. Every kind of row a finish takes is in it: plain successes
 * with their next stage handed on the fast path, ends of runs (plain, with a sink, with another unended
 * stage, of a child run), failures and retries, a wait (a map's counter) and a child run started, a run
 * cancelled between claim and finish, a stale token, a lost lease, two rows of one run in a batch, and
 * a replay of a whole batch whose answer was lost.
 */
const OWNER = 'A';
const CLS = 'x';
const runId = (n: number) => `00000000-0000-4000-8000-${n.toString(16).padStart(12, '0')}`;
const chain = (n: number) => Array.from({ length: n }, (_, i) => spec({ toolClass: CLS, name: `s${i + 1}` }));
const graph = (stages: { deps: number[]; nextSeqs: number[]; sink?: 'only' | 'one_of' }[]) =>
  stages.map((g, i) => ({ ...spec({ toolClass: CLS, name: `g${i + 1}` }), ...g }));

interface Outcome {
  statements: string[][];
  /** The run of each row the light statement took, in the order taken. */
  takenRuns: string[];
  verdicts: unknown[];
  stages: unknown[];
  runs: unknown[];
  events: unknown[];
  waits: unknown[];
}

/** Timestamps (dates, ISO strings) out of a value: they differ between two databases. */
function noTimes(v: unknown): unknown {
  if (v instanceof Date) return 'T';
  if (typeof v === 'string' && /^\d{4}-\d\d-\d\dT\d\d:\d\d/.test(v)) return 'T';
  if (Array.isArray(v)) return v.map(noTimes);
  if (v && typeof v === 'object')
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, k === 'sentAt' || k === 'confirmedUntil' ? 'T' : noTimes(x)]));
  return v;
}

async function scenario(store: Store): Promise<Outcome> {
  const statements: string[][] = [];
  const takenStages: string[] = [];
  const verdicts: unknown[] = [];
  const db = store.db;
  const send = async (rows: FinishRow[]) => {
    const names: string[] = [];
    const q: Queryable = {
      query: async (text, params, name, opts) => {
        names.push(name ?? '?');
        const rows = await db.query(text, params, name, opts);
        // Which rows the light statement took (mapped to their runs at the end).
        if (name === 'ratchet_finish_light') for (const r of rows) if (r.taken) takenStages.push(String(r.id));
        return rows;
      },
    } as Queryable;
    const out = await finishEncoded(
      q,
      OWNER,
      rows.map((r, i) => encodeFinishRow(r, `finish[${i}]`)),
    );
    statements.push(names);
    // The stages a batch made ready, compared per batch: FINISH_SQL names a parent woken by a child run's end
    // under the batch's lowest accepted id (`woken`), whichever row ended the child; which row of the batch
    // reports a wake-up changes nothing in the database (the worker wakes a worker of the class either way).
    const wokenOfBatch = out.flatMap((v) => v.woken.map((w) => w.stageId)).sort();
    verdicts.push(noTimes({ rows: out.map(({ woken, nextStageId, nextToolClass, ...v }) => v), woken: wokenOfBatch }));
    return out;
  };
  const create = (n: number, stages: ReturnType<typeof spec>[], sinksLeft?: number) =>
    store.createRun({ id: runId(n), workflow: 'w', definitionHash: 'h', input: { n }, stages, ...(sinksLeft ? { sinksLeft } : {}) });
  for (const n of [1, 2, 3]) await create(n, chain(3)); // plain chains
  await create(4, chain(1)); // ends at once
  await create(
    5,
    graph([
      { deps: [], nextSeqs: [2] },
      { deps: [1], nextSeqs: [], sink: 'only' },
    ]),
    1,
  ); // a sink
  await create(6, chain(1).concat(chain(1))); // overwritten below: two parallel stages, one ends the run
  await create(7, chain(2)); // cancelled between claim and finish
  await create(8, chain(2)); // a stale token
  await create(9, chain(2)); // its lease lost
  await create(
    11,
    graph([
      { deps: [], nextSeqs: [3] },
      { deps: [], nextSeqs: [] },
      { deps: [1], nextSeqs: [] },
    ]),
  ); // two rows of one run, one ends it
  await create(12, chain(1)); // starts a child run
  await create(13, chain(2)); // waits for a counter (a map's items)
  // Run 6 as two parallel stages (a graph), the first ends the run.
  await db.query(`UPDATE ratchet.stages SET deps = '{}', next_seqs = '{}', deps_left = 0, state = 'queued' WHERE run_id = $1`, [runId(6)]);

  const claimAll = async () =>
    (await store.claim({ owner: OWNER, toolClass: CLS, limit: 100 })).sort((a, b) => Number(a.id) - Number(b.id));
  const first = await claimAll();
  const of = (n: number, seq = 1) => {
    const s = first.find((c) => c.runId === runId(n) && c.seq === seq);
    if (!s) throw new Error(`no claim for run ${n} seq ${seq}`);
    return s;
  };
  const ok = (s: { id: string; fence: string }, extra: Partial<FinishRow> = {}): FinishRow => ({
    stageId: s.id,
    fence: s.fence,
    outcome: 'succeeded',
    result: { from: s.id },
    data: { durationMs: 1 },
    ...extra,
  });

  // Batch 0 (full: a wait with a child run).
  const kidId = runId(120);
  await send([
    {
      stageId: of(12).id,
      fence: of(12).fence,
      outcome: 'waiting',
      waitFor: 1,
      child: {
        id: kidId,
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        sinksLeft: null,
        stages: stageRows([stageSpecSchema.parse(spec({ toolClass: CLS }))], {}, 'child').map(
          (r) => JSON.parse(JSON.stringify(r)) as Record<string, unknown>,
        ),
      },
    },
  ]);
  const [kid] = await store.claim({ owner: OWNER, toolClass: CLS, limit: 1 });
  expect(kid!.runId).toBe(kidId);

  await store.cancelRun(runId(7));
  await db.query(`UPDATE ratchet.stages SET lease_until = now() - interval '1 second' WHERE id = $1`, [of(9).id]);

  // Batch A: every row looks plain; the database proves some of them not.
  const batchA: FinishRow[] = [
    ...[1, 2, 3, 5].map((n) => ok(of(n), { next: { seq: 2, input: { n } }, claimNext: true, effectKey: `k${n}` })),
    ok(of(4), { run: { state: 'succeeded', result: { r: 4 } } }),
    ok(of(6), { run: { state: 'succeeded', result: { r: 6 } } }),
    ok(of(7), { next: { seq: 2, input: {} }, claimNext: true }),
    ok({ id: of(8).id, fence: String(BigInt(of(8).fence) - 1n) }, { next: { seq: 2, input: {} }, claimNext: true }),
    ok(of(9), { next: { seq: 2, input: {} }, claimNext: true }),
    ok(of(11, 1), { next: { seq: 3, input: { j: 1 } }, claimNext: true }),
    ok(of(11, 2), { run: { state: 'succeeded', result: { r: 11 } } }),
    ok(kid!, { run: { state: 'succeeded', result: { kid: 1 } } }),
  ];
  const a = await send(batchA);
  // Batch C: the same batch again, as a worker sends it when the first answer was lost: replays.
  await send(batchA);

  // Batch B: mixed (a failure for good, a retry, a wait): all through the full statement.
  const handed = (n: number) => {
    const v = a.find((x) => x.stageId === of(n).id);
    if (!v?.nextClaimed) throw new Error(`run ${n}: no next stage handed`);
    return v.nextClaimed;
  };
  await send([
    ok(handed(1), { next: { seq: 3, input: {} }, claimNext: true }),
    { stageId: handed(2).id, fence: handed(2).fence, outcome: 'failed', error: { m: 'x' }, run: { state: 'failed', error: { m: 'x' } } },
    { stageId: handed(3).id, fence: handed(3).fence, outcome: 'queued', error: { m: 'again' }, retryDelayMs: 0 },
    { stageId: of(13).id, fence: of(13).fence, outcome: 'waiting', waitFor: 2 },
  ]);
  // Batch D: the sink of run 5 (taken by neither: the full statement counts it down and ends the run) and run 1's end.
  const b = (verdicts.at(-1) as { rows: { stageId: string; nextClaimed: { id: string; fence: string } | null }[] }).rows;
  const r1 = (
    await db.query(`SELECT id::text AS id, fence::text AS fence FROM ratchet.stages WHERE run_id = $1 AND seq = 3`, [runId(1)])
  )[0]!;
  expect(b.find((v) => v.nextClaimed?.id === r1.id)).toBeTruthy();
  await send([ok(handed(5)), ok({ id: r1.id as string, fence: r1.fence as string }, { run: { state: 'succeeded', result: 1 } })]);

  const stages = await db.query(
    `SELECT id::text, run_id, seq, state, owner_id, fence::text, attempt, max_attempts, deps_left, result, error, effect_key, input,
       lease_until IS NULL AS no_lease, finished_at IS NULL AS unfinished, heartbeat_at IS NULL AS no_heartbeat
     FROM ratchet.stages ORDER BY id`,
  );
  const runs = await db.query(
    `SELECT id, state, result, error, sinks_left, finished_at IS NULL AS unfinished, parent_run_id, parent_stage_id::text FROM ratchet.runs ORDER BY id`,
  );
  const events = await db.query(`SELECT run_id, stage_id::text, type, fence::text, attempt, data FROM ratchet.events ORDER BY run_id, id`);
  const waits = await db.query(`SELECT run_id, stage_id::text, kind, outcome FROM ratchet.waits ORDER BY stage_id`);
  const runOf = new Map(
    (await db.query(`SELECT id::text AS id, run_id FROM ratchet.stages WHERE id = ANY($1::bigint[])`, [takenStages])).map((r) => [
      String(r.id),
      String(r.run_id),
    ]),
  );
  return {
    statements,
    takenRuns: takenStages.map((id) => runOf.get(id) ?? '?'),
    verdicts,
    stages: noTimes(stages) as unknown[],
    runs: noTimes(runs) as unknown[],
    events: noTimes(events) as unknown[],
    waits,
  };
}

describe.each(['postgres', 'pglite'] as const)('the light finish on %s', (kind) => {
  const dbs: TestDatabase[] = [];
  const stores: Store[] = [];
  const open = async (label: string) => {
    if (kind === 'pglite') return openStore({ dataDir: ':memory:' });
    const db = await createTestDatabase(label);
    dbs.push(db);
    return openStore({ databaseUrl: db.url });
  };
  beforeAll(async () => {
    stores.push(await open('finish_light_a'), await open('finish_light_b'));
  });
  afterAll(async () => {
    setLightFinish(true);
    for (const s of stores) await s.close();
    for (const d of dbs) await d.drop();
  });

  it('light + fallback leave exactly the stages, runs, events and answers the full statement alone leaves', async () => {
    setLightFinish(true);
    const light = await scenario(stores[0]!);
    setLightFinish(false);
    const full = await scenario(stores[1]!);
    setLightFinish(true);
    // The light statement was used where every row looked plain; the rest went to the full one.
    expect(light.statements).toEqual([
      ['ratchet_finish'],
      ['ratchet_finish_light', 'ratchet_finish'],
      ['ratchet_finish_light', 'ratchet_finish'],
      // a group failure's follow-up: the failed run's leftovers, then child runs a finish started meanwhile (none here)
      ['ratchet_finish', 'ratchet_cancel_failed_leftovers', 'ratchet_cancel_descendants'],
      ['ratchet_finish_light', 'ratchet_finish'],
    ]);
    expect(full.statements.flat().every((n) => n !== 'ratchet_finish_light')).toBe(true);
    // The light statement took the plain rows, and only them: batch A's chains and sink-free first stages (runs 1, 2, 3,
    // 5) and run 4's plain end; nothing of the replayed batch; in batch D run 1's plain end, not run 5's sink.
    expect(light.takenRuns).toEqual([1, 2, 3, 4, 5, 1].map(runId));
    expect(full.takenRuns).toEqual([]);
    expect(light.verdicts).toEqual(full.verdicts);
    expect(light.stages).toEqual(full.stages);
    expect(light.runs).toEqual(full.runs);
    expect(light.events).toEqual(full.events);
    expect(light.waits).toEqual(full.waits);
    // And the scenario did reach every kind of row.
    const types = new Set((full.events as { type: string }[]).map((e) => e.type));
    for (const t of [
      'stage_succeeded',
      'job_claimed',
      'run_succeeded',
      'result_rejected',
      'finish_replayed',
      'run_failed',
      'retry_scheduled',
      'stage_waiting',
      'child_run_started',
      'stage_cancelled',
    ])
      expect(types, t).toContain(t);
  });

  it('the light statement alone takes plain rows only, and a refused row (stale token, lost lease, a sink) is left untouched', async () => {
    const store = stores[0]!;
    const db = store.db;
    const cls = 'solo';
    const mk = (n: number, stages: ReturnType<typeof spec>[], sinksLeft?: number) =>
      store.createRun({ id: runId(n), workflow: 'w', definitionHash: 'h', input: {}, stages, ...(sinksLeft ? { sinksLeft } : {}) });
    await mk(201, [spec({ toolClass: cls }), spec({ toolClass: cls })]);
    await mk(202, [spec({ toolClass: cls }), spec({ toolClass: cls })]);
    await mk(203, [spec({ toolClass: cls }), spec({ toolClass: cls })]);
    await mk(204, [{ ...spec({ toolClass: cls }), deps: [], nextSeqs: [], sink: 'only' }], 1);
    const claimed = (await store.claim({ owner: OWNER, toolClass: cls, limit: 10 })).sort((a, b) => Number(a.id) - Number(b.id));
    expect(claimed).toHaveLength(4);
    const [p, stale, lost, sink] = claimed as [(typeof claimed)[0], (typeof claimed)[0], (typeof claimed)[0], (typeof claimed)[0]];
    await db.query(`UPDATE ratchet.stages SET lease_until = now() - interval '1 second' WHERE id = $1`, [lost.id]);
    const rows = [
      { id: p.id, fence: p.fence, outcome: 'succeeded', result: 1, nextSeq: 2, nextInput: {}, claimNext: true },
      { id: stale.id, fence: String(BigInt(stale.fence) + 1000n), outcome: 'succeeded', result: 1, nextSeq: 2, nextInput: {} },
      { id: lost.id, fence: lost.fence, outcome: 'succeeded', result: 1, nextSeq: 2, nextInput: {} },
      { id: sink.id, fence: sink.fence, outcome: 'succeeded', result: 1 },
    ];
    const snap = async () => ({
      stages: await db.query(`SELECT * FROM ratchet.stages WHERE id = ANY($1::bigint[]) ORDER BY id`, [[stale.id, lost.id, sink.id]]),
      runs: await db.query(`SELECT * FROM ratchet.runs WHERE id = ANY($1::uuid[]) ORDER BY id`, [[runId(202), runId(203), runId(204)]]),
      events: await db.query(`SELECT count(*)::int AS n FROM ratchet.events WHERE stage_id = ANY($1::bigint[])`, [
        [stale.id, lost.id, sink.id],
      ]),
    });
    const before = await snap();
    const out = await db.query(FINISH_LIGHT_SQL, [OWNER, JSON.stringify(rows), rows.map((r) => r.id)]);
    expect(out.map((r) => [r.id, r.taken])).toEqual([
      [p.id, true],
      [stale.id, false],
      [lost.id, false],
      [sink.id, false],
    ]);
    expect(out[0]!.next_claimed).toMatchObject({ seq: 2 });
    expect(await snap()).toEqual(before);
    const evs = await db.query(`SELECT type, fence::text, data FROM ratchet.events WHERE run_id = $1 ORDER BY id`, [runId(201)]);
    expect(evs.map((e) => e.type).slice(-2)).toEqual(['stage_succeeded', 'job_claimed']);
  });
});
