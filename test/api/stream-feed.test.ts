import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEventHub } from '../../src/live/hub.js';
import { openRunStream, type StreamItem } from '../../src/live/run-stream.js';
import type { Queryable } from '../../src/store/db.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startApi, until, type Api } from './helpers.js';

/**
 * The run's shared feed (src/live/run-stream.ts, RunFeed), at its two edges:
 * - a terminal event the feed found final when it read it, taken by a watcher after a retry was
 *   committed (and notified) but before the feed read the run_retried: the watcher asks again and
 *   follows the retry, it does not end on the old terminal event;
 * - a notification while the first watcher is still replaying the history on its own: the feed does
 *   not read that history for nobody, it reads from where that watcher joins.
 * No worker: the tests write the run's events and state themselves (the events trigger notifies).
 */
let db: TestDatabase;
let api: Api;
beforeAll(async () => {
  db = await createTestDatabase('api_stream_feed');
  api = await startApi({ databaseUrl: db.url, poolSize: 8 });
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

/** The store's queryable: stream reads recorded (their `after` position) and held while `gate` is set; end checks counted. */
function gated(q: Queryable) {
  const c = {
    reads: [] as string[],
    held: 0,
    endChecks: 0,
    gate: null as Promise<void> | null,
    db: {
      async query(text, params, name, opts) {
        if (name === 'ratchet_stream_events') {
          c.reads.push(`${params?.[1]}:${params?.[2]}`);
          if (c.gate) {
            c.held++;
            await c.gate;
          }
        }
        if (name === 'ratchet_stream_end_check') c.endChecks++;
        return q.query(text, params, name, opts);
      },
    } as Queryable,
  };
  return c;
}

const insert = async (runId: string, type: string, data: unknown = {}) =>
  (
    await db.query(`INSERT INTO ratchet.events (run_id, type, data) VALUES ($1, $2, $3) RETURNING id::text AS id`, [
      runId,
      type,
      JSON.stringify(data),
    ])
  )[0]!.id as string;

interface Watcher {
  types: string[];
  ended: boolean;
  done: Promise<void>;
}
function consume(stream: AsyncGenerator<StreamItem>, pauseAfter?: { type: string; until: Promise<void> }): Watcher {
  const w: Watcher = { types: [], ended: false, done: Promise.resolve() };
  w.done = (async () => {
    for await (const item of stream) {
      if (item.kind !== 'event') continue;
      w.types.push(item.event.type);
      if (pauseAfter && item.event.type === pauseAfter.type) await pauseAfter.until; // held up writing to a slow client
    }
    w.ended = true;
  })();
  return w;
}

describe('the run feed', () => {
  it('a watcher taking the old terminal event after a retry was committed (not yet read by the feed) follows the retry', async () => {
    const { id } = await api.client.submit('gate', { key: 'feed-retry' });
    const g = gated(api.ratchet.store.db);
    const hub = createEventHub(api.ratchet.store.db);
    let notes = 0;
    const offNotes = hub.subscribe(id, () => notes++);
    try {
      const ac = new AbortController();
      const open = async () => (await openRunStream(g.db, hub, id, { heartbeatMs: 60_000, signal: ac.signal }))!;
      let resumeB!: () => void;
      const a = consume(await open());
      const b = consume(await open(), { type: 'probe', until: new Promise<void>((r) => (resumeB = r)) });
      await insert(id, 'probe');
      await until('both watchers took the probe', async () => a.types.includes('probe') && b.types.includes('probe'));

      // The run fails: the feed reads run_failed, finds the run over, marks it; A ends on it.
      await db.query(`UPDATE ratchet.runs SET state = 'failed', finished_at = now() WHERE id = $1`, [id]);
      await insert(id, 'run_failed', { error: { message: 'boom' } });
      await a.done;
      expect(a.types.at(-1)).toBe('run_failed');

      // Retried: committed and notified, but the feed's read of it is held.
      let release!: () => void;
      g.gate = new Promise<void>((r) => (release = r));
      const notes0 = notes;
      await db.query(`UPDATE ratchet.runs SET state = 'queued', finished_at = NULL WHERE id = $1`, [id]);
      await insert(id, 'run_retried', { by: 'test' });
      await until('the retry notified and the feed reading it', async () => notes > notes0 && g.held > 0);

      // B, held up until now, takes run_failed from the feed's buffer: it must check again, not end.
      const checks0 = g.endChecks;
      resumeB();
      await until(
        'B took run_failed and checked again (or ended)',
        async () => b.types.includes('run_failed') && (g.endChecks > checks0 || b.ended),
      );
      expect(b.ended).toBe(false);
      g.gate = null;
      release();
      await until('B got the retry', async () => b.types.includes('run_retried'));
      expect(b.ended).toBe(false);

      // The retry fails for good: B ends there.
      await db.query(`UPDATE ratchet.runs SET state = 'failed', finished_at = now() WHERE id = $1`, [id]);
      await insert(id, 'run_failed', { error: { message: 'boom again' } });
      await b.done;
      expect(b.types.filter((t) => t !== 'probe' && t !== 'run_submitted' && !t.startsWith('stage_'))).toEqual([
        'run_failed',
        'run_retried',
        'run_failed',
      ]);
    } finally {
      offNotes();
      await hub.close();
    }
  });

  it("a notification during the first watcher's replay does not make the feed read the history for nobody", async () => {
    const { id } = await api.client.submit('gate', { key: 'feed-replay' });
    await db.query(
      `INSERT INTO ratchet.events (run_id, type, data) SELECT $1, 'heartbeat_ok', jsonb_build_object('n', n) FROM generate_series(1, 1200) n`,
      [id],
    );
    const g = gated(api.ratchet.store.db);
    const hub = createEventHub(api.ratchet.store.db);
    let notes = 0;
    const offNotes = hub.subscribe(id, () => notes++);
    try {
      const ac = new AbortController();
      let release!: () => void;
      g.gate = new Promise<void>((r) => (release = r));
      const w = consume((await openRunStream(g.db, hub, id, { heartbeatMs: 60_000, signal: ac.signal }))!);
      await until('the replay reading', async () => g.held > 0);
      const notes0 = notes;
      await insert(id, 'probe');
      await until('notified', async () => notes > notes0);
      g.gate = null;
      release();
      await until('the watcher has the probe', async () => w.types.includes('probe'));
      expect(w.types.filter((t) => t === 'heartbeat_ok')).toHaveLength(1200);
      // The history from the start was read once: by the watcher itself.
      expect(g.reads.filter((r) => r === '0:0')).toHaveLength(1);
      // Still live: a later event comes through the feed.
      await insert(id, 'probe2');
      await until('the watcher has probe2', async () => w.types.includes('probe2'));
      ac.abort();
      await w.done;
    } finally {
      offNotes();
      await hub.close();
    }
  });
});
