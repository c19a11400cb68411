import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEventHub } from '../../src/live/hub.js';
import { createSseParser } from '../../src/client/sse.js';
import { openRunStream, type StreamItem } from '../../src/live/run-stream.js';
import type { Queryable } from '../../src/store/db.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { callsOf, release } from './fixtures.js';
import { startApi, TOKEN, until, type Api } from './helpers.js';

/**
 * Many watchers of one run (PostgreSQL, LISTEN/NOTIFY): they share one read per notification
 * (the run's feed in src/live/run-stream.ts), and each still gets every event exactly once, in
 * stream order, whenever it joined (from the start, a history replay, a Last-Event-ID resume).
 */
let db: TestDatabase;
let api: Api;
beforeAll(async () => {
  db = await createTestDatabase('api_stream_watchers');
  api = await startApi({ databaseUrl: db.url, poolSize: 8 });
  await api.ratchet.worker({ classes: ['quick', 'long'], pollIntervalMs: 50 }).start();
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

/** The store's queryable, counting the stream reads ('ratchet_stream_events') and those that found rows held back. */
function counting(q: Queryable) {
  const c = {
    reads: 0,
    heldBack: 0,
    db: {
      async query(text, params, name, opts) {
        const rows = await q.query(text, params, name, opts);
        if (name === 'ratchet_stream_events') {
          c.reads++;
          if (rows.some((r) => r.final !== true)) c.heldBack++;
        }
        return rows;
      },
    } as Queryable,
  };
  return c;
}

interface Watcher {
  ids: string[];
  done: Promise<void>;
  ended: boolean;
  stopped: boolean;
  /** The Last-Event-ID it started after. */
  from: string | undefined;
  stop(): void;
}

describe('many watchers of one run', () => {
  it('join at different moments: each gets every event once, in order; stream reads per notification do not grow with watchers', async () => {
    const { id } = await api.client.submit('gate', { key: 'many-watchers' });
    await until('the gate stage running', async () => callsOf('gate', 'many-watchers').length > 0);
    const counter = counting(api.ratchet.store.db);
    const hub = createEventHub(api.ratchet.store.db);
    let notifications = 0;
    const offCount = hub.subscribe(id, () => notifications++);

    const watch = async (afterEventId: string | undefined, slowMs: number): Promise<Watcher> => {
      const ac = new AbortController();
      const stream = (await openRunStream(counter.db, hub, id, {
        heartbeatMs: 60_000,
        signal: ac.signal,
        ...(afterEventId ? { afterEventId } : {}),
      }))!;
      const w: Watcher = {
        ids: [],
        ended: false,
        stopped: false,
        from: afterEventId,
        done: Promise.resolve(),
        stop: () => {
          w.stopped = true;
          ac.abort();
        },
      };
      w.done = (async () => {
        for await (const item of stream as AsyncGenerator<StreamItem>) {
          if (item.kind !== 'event') continue;
          w.ids.push(item.event.id);
          if (slowMs) await new Promise((r) => setTimeout(r, slowMs * Math.random()));
        }
        w.ended = !ac.signal.aborted;
      })();
      return w;
    };
    /** The run's events in stream order (tx, id), as the table has them now. */
    const table = async () =>
      (await db.query(`SELECT id::text AS id FROM ratchet.events WHERE run_id = $1 ORDER BY coalesce(tx, '0'::xid8), id`, [id])).map(
        (r) => r.id as string,
      );
    const insert = async (n: number) =>
      (
        await db.query(`INSERT INTO ratchet.events (run_id, type, data) VALUES ($1, 'heartbeat_ok', $2) RETURNING id::text AS id`, [
          id,
          JSON.stringify({ n }),
        ])
      )[0]!.id as string;
    const watchers: Watcher[] = [];
    /** Every watcher still open has everything the table has. */
    const caughtUp = async () => {
      const all = await table();
      return watchers.every((w) => w.ended || w.stopped || (w.ids.at(-1) ?? w.from) === all.at(-1));
    };
    let n = 0;
    const step = async () => {
      await insert(++n);
      await until('every watcher caught up', caughtUp);
    };

    // From the start: 10 watchers, 4 of them slow readers.
    for (let i = 0; i < 10; i++) watchers.push(await watch(undefined, i < 4 ? 15 : 0));
    for (let i = 0; i < 5; i++) await step();
    // A history replay joining mid-run, and resumes from the middle (Last-Event-ID).
    const sofar = await table();
    for (let i = 0; i < 8; i++) watchers.push(await watch(undefined, i % 2 ? 10 : 0));
    for (let i = 0; i < 8; i++) watchers.push(await watch(sofar[1 + i]!, i % 3 ? 0 : 10));
    for (let i = 0; i < 5; i++) await step();
    // Disconnect two watchers mid-run and resume them with their last event id.
    const resumed: { before: Watcher; after: Watcher }[] = [];
    for (const w of watchers.slice(2, 4)) {
      w.stop();
      await w.done;
      resumed.push({ before: w, after: await watch(w.ids.at(-1)!, 0) });
    }
    watchers.push(...resumed.map((r) => r.after));
    await until('every watcher caught up', caughtUp);

    // Steady state: 26 watchers at the head. Each notification costs one read (plus re-reads of held-back rows), not one per watcher.
    const open = watchers.filter((w) => !w.ended && !resumed.some((r) => r.before === w));
    expect(open.length).toBe(26);
    const reads0 = counter.reads;
    const held0 = counter.heldBack;
    const notes0 = notifications;
    for (let i = 0; i < 20; i++) await step();
    const reads = counter.reads - reads0;
    const notes = notifications - notes0;
    const heldBack = counter.heldBack - held0;
    expect(notes).toBeGreaterThanOrEqual(20);
    // + 1: a re-read of rows held back just before the count began may fall inside it. (With a read per watcher woken
    // (single flight only while a read is in flight), the slow watchers alone made 33 reads here for 20 notifications.)
    expect(reads).toBeLessThanOrEqual(notes + heldBack + 1);

    // The run ends: every watcher ends on the terminal event with every event once, in stream order.
    release('many-watchers');
    await Promise.all(open.map((w) => w.done));
    const all = await table();
    expect(all.length).toBeGreaterThan(30);
    const last = (await api.client.events(id, { limit: 1000 })).events.at(-1)!;
    expect(last.type).toBe('run_succeeded');
    for (const w of watchers.slice(0, 10)) {
      const got = resumed.find((r) => r.before === w);
      const ids = got ? [...w.ids, ...got.after.ids] : w.ids;
      expect(ids).toEqual(all);
    }
    for (const w of watchers.slice(10, 18)) expect(w.ids).toEqual(all);
    for (let i = 0; i < 8; i++) expect(watchers[18 + i]!.ids).toEqual(all.slice(all.indexOf(sofar[1 + i]!) + 1));
    for (const w of open) expect(w.ended).toBe(true);
    offCount();
    await hub.close();
  });

  it('over HTTP (the events of one read in one write, encoded once for the watchers sharing them): every watcher gets every event once, in order', async () => {
    const { id } = await api.client.submit('gate', { key: 'http-watchers' });
    await until('the gate stage running', async () => callsOf('gate', 'http-watchers').length > 0);
    const table = async () =>
      (await db.query(`SELECT id::text AS id FROM ratchet.events WHERE run_id = $1 ORDER BY coalesce(tx, '0'::xid8), id`, [id])).map(
        (r) => r.id as string,
      );
    const insert = async (n: number) =>
      db.query(
        `INSERT INTO ratchet.events (run_id, type, data) SELECT $1, 'heartbeat_ok', jsonb_build_object('n', $2::int, 'k', k) FROM generate_series(1, $3::int) k`,
        [
          id,
          n,
          1 + (n % 3), // one to three events per statement: reads of one and of several events
        ],
      );
    const watch = async (after: string | undefined, slowMs: number) => {
      const res = await fetch(`${api.server.url}/v1/runs/${id}/stream`, {
        headers: { authorization: `Bearer ${TOKEN}`, ...(after ? { 'last-event-id': after } : {}) },
      });
      expect(res.status).toBe(200);
      const w = { after, ids: [] as string[], types: [] as string[], done: Promise.resolve() };
      const parser = createSseParser();
      const decoder = new TextDecoder();
      w.done = (async () => {
        for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
          for (const m of parser.push(decoder.decode(chunk, { stream: true }))) {
            w.ids.push(m.id!);
            w.types.push((JSON.parse(m.data) as { type: string }).type);
          }
          if (slowMs) await new Promise((r) => setTimeout(r, slowMs * Math.random()));
        }
      })();
      return w;
    };
    const watchers = [];
    for (let i = 0; i < 12; i++) watchers.push(await watch(undefined, i < 3 ? 20 : 0));
    for (let n = 1; n <= 6; n++) await insert(n);
    const sofar = await table();
    for (let i = 0; i < 4; i++) watchers.push(await watch(undefined, i % 2 ? 10 : 0));
    for (let i = 0; i < 4; i++) watchers.push(await watch(sofar[2 + i]!, i % 2 ? 0 : 10));
    for (let n = 7; n <= 15; n++) await insert(n);
    release('http-watchers');
    await Promise.all(watchers.map((w) => w.done));
    const all = await table();
    for (const w of watchers) {
      expect(w.ids).toEqual(w.after ? all.slice(all.indexOf(w.after) + 1) : all);
      expect(w.types.at(-1)).toBe('run_succeeded');
    }
  });
});
