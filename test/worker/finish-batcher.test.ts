import { describe, expect, it } from 'vitest';
import { DbLanes } from '../../src/worker/db-lanes.js';
import { FinishBatcher } from '../../src/worker/finish-batcher.js';
import type { FinishRow, Queryable } from '../../src/store/index.js';
import type { Row } from '../../src/store/db.js';

/**
 * The finish batcher against a database of the test's own (no PostgreSQL): what one statement
 * carries, and that every caller learns its own row's fate. A batch whose statement fails leaves
 * every row's outcome unknown (each caller gets the error, none is answered as done and none is
 * dropped); a row the answer does not name is an error for its caller, never a success.
 */
const success = (stageId: string, extra: Partial<FinishRow> = {}): FinishRow => ({
  stageId,
  fence: '1',
  outcome: 'succeeded',
  result: { n: Number(stageId) },
  next: { seq: 2, input: { n: Number(stageId) } },
  claimNext: true,
  data: { durationMs: 0, owner: 'w' },
  ...extra,
});

interface Sent {
  name: string | undefined;
  rows: Record<string, unknown>[];
  ids: string[];
}

function fakeDb(answer: (sent: Sent) => Promise<Row[]>): { db: Queryable; sent: Sent[] } {
  const sent: Sent[] = [];
  const db: Queryable = {
    async query<R extends Row>(_text: string, params: readonly unknown[] = [], name?: string): Promise<R[]> {
      if (name !== 'ratchet_finish') return []; // a failed run's leftovers, cancelled by a statement of its own
      const s = { name, rows: JSON.parse(params[1] as string) as Record<string, unknown>[], ids: params[2] as string[] };
      sent.push(s);
      return (await answer(s)) as R[];
    },
  };
  return { db, sent };
}

const verdictRow = (id: string): Row => ({
  id,
  accepted: true,
  replayed: false,
  woken: [],
  current_state: 'succeeded',
  current_fence: '1',
  db_now: new Date(),
  next_claimed: null,
});

const farAhead = () => performance.now() + 60_000;

describe('FinishBatcher', () => {
  it('rows finishing together go in one statement, in stage id order, each with only its own keys; each caller gets its own verdict', async () => {
    const { db, sent } = fakeDb(async (s) => s.rows.map((r) => verdictRow(String(r.id))));
    const b = new FinishBatcher(db, 'w', 5);
    const ids = ['30', '4', '1000', '7'];
    const verdicts = await Promise.all(ids.map((id) => b.finish(success(id), farAhead())));
    expect(verdicts.map((v) => v.stageId)).toEqual(ids);
    expect(verdicts.every((v) => v.accepted)).toBe(true);
    expect(sent).toHaveLength(1);
    expect(sent[0]!.name).toBe('ratchet_finish');
    expect(sent[0]!.ids).toEqual(['4', '7', '30', '1000']);
    expect(sent[0]!.rows[0]).toEqual({
      id: '4',
      fence: '1',
      outcome: 'succeeded',
      result: { n: 4 },
      nextSeq: 2,
      nextInput: { n: 4 },
      claimNext: true,
      data: { durationMs: 0, owner: 'w' },
    });
  });

  it('a failed statement: every row of the batch is unknown to its caller (the error), none answered, none dropped', async () => {
    const down = Object.assign(new Error('connection terminated'), { code: '57P01' });
    const { db, sent } = fakeDb(async () => {
      throw down;
    });
    const b = new FinishBatcher(db, 'w', 5);
    const settled = await Promise.allSettled(['1', '2', '3'].map((id) => b.finish(success(id), farAhead())));
    expect(sent).toHaveLength(1);
    expect(sent[0]!.ids).toEqual(['1', '2', '3']);
    expect(settled.map((s) => (s.status === 'rejected' ? s.reason : 'answered'))).toEqual([down, down, down]);
  });

  it('a row the answer does not name is an error for its caller, the others get theirs', async () => {
    const { db } = fakeDb(async (s) => s.rows.filter((r) => r.id !== '2').map((r) => verdictRow(String(r.id))));
    const b = new FinishBatcher(db, 'w', 5);
    const settled = await Promise.allSettled(['1', '2', '3'].map((id) => b.finish(success(id), farAhead())));
    expect(settled[0]).toMatchObject({ status: 'fulfilled', value: { stageId: '1', accepted: true } });
    expect(settled[1]).toMatchObject({ status: 'rejected' });
    expect(String((settled[1] as PromiseRejectedResult).reason)).toMatch(/no verdict for stage 2/);
    expect(settled[2]).toMatchObject({ status: 'fulfilled', value: { stageId: '3', accepted: true } });
  });

  it('a bad row is refused alone, before it joins; a row with little lease left goes alone at once', async () => {
    const { db, sent } = fakeDb(async (s) => s.rows.map((r) => verdictRow(String(r.id))));
    const b = new FinishBatcher(db, 'w', 50);
    expect(() => b.finish(success('9', { result: { bad: Number.NaN } }), farAhead())).toThrow(/not JSON/); // thrown at once, for this row alone
    const alone = await b.finish(success('5'), performance.now() + 10);
    expect(alone.stageId).toBe('5');
    expect(sent.map((s) => s.ids)).toEqual([['5']]);
  });

  it('a failure with a retry, a failure for good and a failure kept as a value keep their keys; absent ones are absent', async () => {
    const { db, sent } = fakeDb(async (s) => s.rows.map((r) => verdictRow(String(r.id))));
    const b = new FinishBatcher(db, 'w', 5);
    await Promise.all([
      b.finish({ stageId: '1', fence: '2', outcome: 'queued', retryDelayMs: 0, error: { message: 'x' } }, farAhead()),
      b.finish(
        { stageId: '2', fence: '2', outcome: 'failed', error: { message: 'y' }, run: { state: 'failed', error: { m: 1 } } },
        farAhead(),
      ),
      b.finish({ stageId: '3', fence: '2', outcome: 'failed', error: { message: 'z' }, asValue: true, effectKey: 'k' }, farAhead()),
    ]);
    expect(sent[0]!.rows).toEqual([
      { id: '1', fence: '2', outcome: 'queued', error: { message: 'x' }, retryDelayMs: 0 },
      { id: '2', fence: '2', outcome: 'failed', error: { message: 'y' }, runState: 'failed', runError: { m: 1 } },
      { id: '3', fence: '2', outcome: 'failed', error: { message: 'z' }, asValue: true, effectKey: 'k' },
    ]);
  });

  it('a split batch whose full statement fails after the light one committed: the light rows keep their verdicts (and handed stages), only the rest get the error', async () => {
    const calls: string[] = [];
    const db: Queryable = {
      async query<R extends Row>(_text: string, params: readonly unknown[] = [], name?: string): Promise<R[]> {
        calls.push(String(name));
        const ids = params[2] as string[] | undefined;
        if (name === 'ratchet_finish_light') {
          // The database takes 1 and 3 (1 hands its next stage); 2 is left for the full statement.
          return ids!.map((id) => ({
            id,
            taken: id !== '2',
            woken: id === '1' ? [{ stageId: '11', toolClass: 'c' }] : [],
            current_fence: '1',
            db_now: new Date(),
            next_claimed: null,
          })) as unknown as R[];
        }
        if (name === 'ratchet_finish') throw Object.assign(new Error('Connection terminated unexpectedly'), { code: 'ECONNRESET' });
        return [];
      },
    };
    const b = new FinishBatcher(db, 'w', 5);
    const settled = await Promise.allSettled(['1', '2', '3'].map((id) => b.finish(success(id), farAhead())));
    expect(calls).toEqual(['ratchet_finish_light', 'ratchet_finish']);
    expect(settled[0]).toMatchObject({ status: 'fulfilled', value: { stageId: '1', accepted: true, nextStageId: '11' } });
    expect(settled[1]).toMatchObject({ status: 'rejected', reason: { message: 'Connection terminated unexpectedly' } });
    expect(settled[2]).toMatchObject({ status: 'fulfilled', value: { stageId: '3', accepted: true } });
  });

  it('with its lane busy, finishes wait and go out together when it frees, one statement, each caller its own verdict', async () => {
    const { db, sent } = fakeDb(async (s) => s.rows.map((r) => verdictRow(String(r.id))));
    const lanes = new DbLanes(1);
    const held = (await lanes.acquire())!; // another statement of this worker (a claim) is in flight
    const b = new FinishBatcher(db, 'w', 2, lanes);
    const first = b.finish(success('1'), farAhead());
    await new Promise((r) => setTimeout(r, 20)); // well past the window: it would have gone alone
    const later = ['2', '3'].map((id) => b.finish(success(id), farAhead()));
    await new Promise((r) => setTimeout(r, 20));
    expect(sent).toHaveLength(0);
    held();
    const verdicts = await Promise.all([first, ...later]);
    expect(verdicts.map((v) => v.stageId)).toEqual(['1', '2', '3']);
    expect(sent.map((s) => s.ids)).toEqual([['1', '2', '3']]);
    expect(lanes.inFlight).toBe(0);
  });

  it('a failed statement gives its lane back: the next batch goes out', async () => {
    let fail = true;
    const { db, sent } = fakeDb(async (s) => {
      if (fail) throw Object.assign(new Error('connection terminated'), { code: '57P01' });
      return s.rows.map((r) => verdictRow(String(r.id)));
    });
    const lanes = new DbLanes(1);
    const b = new FinishBatcher(db, 'w', 2, lanes);
    await expect(b.finish(success('1'), farAhead())).rejects.toThrow(/connection terminated/);
    expect(lanes.inFlight).toBe(0);
    fail = false;
    await expect(b.finish(success('2'), farAhead())).resolves.toMatchObject({ stageId: '2', accepted: true });
    expect(sent.map((s) => s.ids)).toEqual([['1'], ['2']]);
  });

  it('a finish with little lease left goes at once without a lane; with batching off, each goes alone in a lane', async () => {
    const { db, sent } = fakeDb(async (s) => s.rows.map((r) => verdictRow(String(r.id))));
    const lanes = new DbLanes(1);
    const held = (await lanes.acquire())!;
    const urgent = await new FinishBatcher(db, 'w', 2, lanes).finish(success('7'), performance.now() + 10);
    expect(urgent.stageId).toBe('7');
    const unbatched = new FinishBatcher(db, 'w', 0, lanes);
    const two = ['8', '9'].map((id) => unbatched.finish(success(id), farAhead()));
    await new Promise((r) => setTimeout(r, 10));
    expect(sent.map((s) => s.ids)).toEqual([['7']]);
    held();
    await Promise.all(two);
    expect(sent.map((s) => s.ids)).toEqual([['7'], ['8'], ['9']]);
  });

  it('a finish waiting for a lane whose lease room runs short goes then, at once and without a lane', async () => {
    const { db, sent } = fakeDb(async (s) => s.rows.map((r) => verdictRow(String(r.id))));
    const lanes = new DbLanes(1);
    const held = (await lanes.acquire())!; // held for good: only the lease can send it
    const b = new FinishBatcher(db, 'w', 2, lanes);
    const shortSoon = b.finish(success('1'), performance.now() + 1250); // room enough to wait, for about 1 s
    const long = b.finish(success('2'), farAhead());
    await new Promise((r) => setTimeout(r, 300));
    expect(sent).toHaveLength(0);
    await expect(shortSoon).resolves.toMatchObject({ stageId: '1', accepted: true });
    expect(sent.map((s) => s.ids)).toEqual([['1']]);
    expect(lanes.inFlight).toBe(1);
    held();
    await expect(long).resolves.toMatchObject({ stageId: '2' });
    expect(sent.map((s) => s.ids)).toEqual([['1'], ['2']]);
  });

  it('more than a batch waiting for a lane: 200 go in the first statement, the rest in the next, none lost', async () => {
    const { db, sent } = fakeDb(async (s) => s.rows.map((r) => verdictRow(String(r.id))));
    const lanes = new DbLanes(1);
    const held = (await lanes.acquire())!;
    const b = new FinishBatcher(db, 'w', 2, lanes);
    const ids = Array.from({ length: 250 }, (_, i) => String(i + 1));
    const all = Promise.all(ids.map((id) => b.finish(success(id), farAhead())));
    await new Promise((r) => setTimeout(r, 10));
    held();
    const verdicts = await all;
    expect(verdicts.map((v) => v.stageId)).toEqual(ids);
    expect(sent.map((s) => s.ids.length)).toEqual([200, 50]);
    expect(new Set(sent.flatMap((s) => s.ids)).size).toBe(250);
    expect(lanes.inFlight).toBe(0);
  });

  it('batching off: a finish waiting for a lane also goes at once without one when its lease room runs short', async () => {
    const { db, sent } = fakeDb(async (s) => s.rows.map((r) => verdictRow(String(r.id))));
    const lanes = new DbLanes(1);
    const held = (await lanes.acquire())!;
    const b = new FinishBatcher(db, 'w', 0, lanes);
    const shortSoon = b.finish(success('1'), performance.now() + 1250);
    await new Promise((r) => setTimeout(r, 300));
    expect(sent).toHaveLength(0);
    await expect(shortSoon).resolves.toMatchObject({ stageId: '1', accepted: true });
    expect(lanes.inFlight).toBe(1); // the test's lane only
    held();
    expect(lanes.inFlight).toBe(0);
  });
});
