import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EventJson } from '../../src/client/index.js';
import { createClient } from '../../src/client/index.js';
import { createSseParser } from '../../src/client/sse.js';
import { createEventHub } from '../../src/live/hub.js';
import { openRunStream, type StreamItem } from '../../src/live/run-stream.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { callsOf, release } from './fixtures.js';
import { startApi, TOKEN, until, type Api } from './helpers.js';

/** The live stream on PostgreSQL (LISTEN/NOTIFY) through the real server, client and an in-process worker. */
let db: TestDatabase;
let api: Api;
beforeAll(async () => {
  db = await createTestDatabase('api_stream');
  api = await startApi({ databaseUrl: db.url, poolSize: 8, streamHeartbeatMs: 300 });
  await api.ratchet.worker({ classes: ['quick', 'long'], pollIntervalMs: 50 }).start();
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

interface Raw {
  status: number;
  ids: string[];
  events: EventJson[];
  comments: number;
  close(): void;
  ended: Promise<void>;
}

/** Opens the stream with raw fetch and collects messages; close() drops the connection mid-way. */
async function open(id: string, headers: Record<string, string> = {}, token: string | null = TOKEN): Promise<Raw> {
  const ac = new AbortController();
  const res = await fetch(`${api.server.url}/v1/runs/${id}/stream`, {
    headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...headers },
    signal: ac.signal,
  });
  const raw: Raw = { status: res.status, ids: [], events: [], comments: 0, close: () => ac.abort(), ended: Promise.resolve() };
  if (res.status !== 200) {
    (raw as { body?: unknown }).body = await res.text().then((t) => (t ? JSON.parse(t) : null));
    return raw;
  }
  const parser = createSseParser();
  const decoder = new TextDecoder();
  raw.ended = (async () => {
    try {
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        const text = decoder.decode(chunk, { stream: true });
        raw.comments += (text.match(/^: heartbeat$/gm) ?? []).length;
        for (const m of parser.push(text)) {
          raw.ids.push(m.id!);
          raw.events.push(JSON.parse(m.data) as EventJson);
        }
      }
    } catch {
      /* aborted */
    }
  })();
  return raw;
}

const allEvents = async (id: string) => (await api.client.events(id, { limit: 1000 })).events;

describe('GET /v1/runs/:id/stream', () => {
  it('disconnect mid-run, reconnect with Last-Event-ID: every event exactly once, in order, ending with the terminal event', async () => {
    const { id } = await api.client.submit('gate', { key: 'stream-resume' });
    const first = await open(id);
    expect(first.status).toBe(200);
    await until('the gate stage claimed on the stream', async () => first.events.some((e) => e.type === 'job_claimed'));
    first.close();
    await first.ended;
    const lastSeen = first.ids.at(-1)!;
    // Events keep coming while nobody watches: the gate stage finishes, the next one runs.
    await until('the gate stage running', async () => callsOf('gate', 'stream-resume').length > 0);
    release('stream-resume');
    await until('the run to end', async () => (await api.client.get(id)).state === 'succeeded');
    const second = await open(id, { 'last-event-id': lastSeen });
    expect(second.status).toBe(200);
    await second.ended; // the server ends it after the terminal event
    const streamed = [...first.events, ...second.events];
    const table = await allEvents(id);
    expect(streamed.map((e) => e.id)).toEqual(table.map((e) => e.id));
    expect(new Set(streamed.map((e) => e.id)).size).toBe(streamed.length);
    expect(streamed.at(-1)!.type).toBe('run_succeeded');
    expect([...first.ids, ...second.ids]).toEqual(streamed.map((e) => e.id)); // the SSE id is the event id
    expect(streamed[0]).toMatchObject({ runId: id, type: 'run_submitted' });
  });

  it('a watcher of a finished run gets its history and the end; resuming after the end is 204', async () => {
    const { id } = await api.client.submit('echo', { key: 'stream-finished' });
    await until('the run to end', async () => (await api.client.get(id)).state === 'succeeded');
    const s = await open(id);
    await s.ended;
    expect(s.events.map((e) => e.id)).toEqual((await allEvents(id)).map((e) => e.id));
    expect(s.events.at(-1)!.type).toBe('run_succeeded');
    const after = await open(id, { 'last-event-id': s.ids.at(-1)! });
    expect(after.status).toBe(204);
    // Resuming from the middle of a finished run: the rest, then the end.
    const mid = await open(id, { 'last-event-id': s.ids[1]! });
    await mid.ended;
    expect(mid.events.map((e) => e.id)).toEqual(s.ids.slice(2));
  });

  it('heartbeat comments on a quiet stream; the token, an unknown run and a foreign Last-Event-ID are refused before streaming', async () => {
    const { id } = await api.client.submit('gate', { key: 'stream-quiet' });
    const s = await open(id);
    await until('two heartbeats', async () => s.comments >= 2, 5000);
    s.close();
    const other = await api.client.submit('echo', { key: 'stream-other' });
    await until('the other run to end', async () => (await api.client.get(other.id)).state === 'succeeded');
    const foreign = (await allEvents(other.id))[0]!.id;
    expect(await open(id, {}, null)).toMatchObject({ status: 401 });
    expect(await open(id, {}, 'wrong-token-123456')).toMatchObject({ status: 401 });
    expect(await open('01890f4e-0000-7000-8000-000000000000')).toMatchObject({ status: 404, body: { error: { code: 'unknown_run' } } });
    expect(await open(id, { 'last-event-id': foreign })).toMatchObject({
      status: 422,
      body: { error: { code: 'invalid_input', path: 'Last-Event-ID' } },
    });
    expect(await open(id, { 'last-event-id': 'abc' })).toMatchObject({
      status: 400,
      body: { error: { code: 'invalid_request', path: 'Last-Event-ID' } },
    });
    release('stream-quiet');
  });

  it('an event whose transaction commits after a later id is never skipped (stream order follows commits)', async () => {
    const { id } = await api.client.submit('gate', { key: 'stream-order' });
    await until('the gate stage running', async () => callsOf('gate', 'stream-order').length > 0);
    const hub = createEventHub(api.ratchet.store.db);
    const seen: string[] = [];
    const ac = new AbortController();
    const stream = (await openRunStream(api.ratchet.store.db, hub, id, { heartbeatMs: 100, signal: ac.signal }))!;
    const reading = (async () => {
      for await (const item of stream as AsyncGenerator<StreamItem>) if (item.kind === 'event') seen.push(item.event.id);
    })();
    await until('the history so far', async () => seen.length >= 2);
    const before = seen.length;
    // T1 takes the lower id and stays open; T2 takes a higher id and commits first.
    const pg = await import('pg');
    const c1 = new pg.default.Client({ connectionString: db.url });
    await c1.connect();
    await c1.query('BEGIN');
    const [low] = (
      await c1.query(`INSERT INTO ratchet.events (run_id, type, data) VALUES ($1, 'heartbeat_ok', '{"n":1}') RETURNING id::text`, [id])
    ).rows;
    const [high] = await db.query(
      `INSERT INTO ratchet.events (run_id, type, data) VALUES ($1, 'heartbeat_ok', '{"n":2}') RETURNING id::text`,
      [id],
    );
    expect(BigInt(high!.id)).toBeGreaterThan(BigInt(low!.id));
    await new Promise((r) => setTimeout(r, 400));
    expect(seen.slice(before)).toEqual([]); // held back while an older transaction is open
    await c1.query('COMMIT');
    await c1.end();
    await until('both events', async () => seen.length >= before + 2);
    expect(seen.slice(before, before + 2).sort()).toEqual([low!.id, high!.id].sort());
    release('stream-order');
    await reading;
    expect(new Set(seen).size).toBe(seen.length);
    expect([...seen].sort()).toEqual((await allEvents(id)).map((e) => e.id).sort());
    ac.abort();
    await hub.close();
  });
});

describe('client.watch', () => {
  it('yields every event once until the terminal event, reconnecting with Last-Event-ID after a dropped connection', async () => {
    let streams = 0;
    const dropping: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      if (!String(input).endsWith('/stream') || ++streams > 1) return res;
      // The first stream dies after its first chunk of events.
      const reader = res.body!.getReader();
      const body = new ReadableStream<Uint8Array>({
        async pull(ctl) {
          const { value, done } = await reader.read();
          if (done) return ctl.close();
          ctl.enqueue(value);
          if (new TextDecoder().decode(value).includes('job_claimed')) {
            await reader.cancel();
            ctl.error(new Error('connection reset'));
          }
        },
      });
      return new Response(body, { status: res.status, headers: res.headers });
    };
    const client = createClient({ baseUrl: api.server.url, token: TOKEN, fetch: dropping });
    const { id } = await client.submit('gate', { key: 'watch-drop' });
    const seen: EventJson[] = [];
    let released = false;
    const it = client.watch(id, { reconnectMs: 10 });
    let r = await it.next();
    while (!r.done) {
      seen.push(r.value);
      // The claim's event can reach the client before the worker calls the tool: wait for the call,
      // else the gate is never released and no further event comes.
      if (r.value.type === 'job_claimed' && !released) {
        await until('the gate called', async () => callsOf('gate', 'watch-drop').length > 0);
        release('watch-drop');
        released = true;
      }
      r = await it.next();
    }
    expect(r.value).toMatchObject({ outcome: 'ended', terminal: 'run_succeeded', via: 'stream' });
    expect(r.value.reconnects).toBeGreaterThanOrEqual(1);
    expect(seen.map((e) => e.id)).toEqual((await allEvents(id)).map((e) => e.id));
  });

  it('falls back to the bounded poller when the server has no stream', async () => {
    const noStream: typeof fetch = async (input, init) =>
      String(input).endsWith('/stream')
        ? new Response(JSON.stringify({ error: { code: 'not_found', message: 'no route', path: null, details: {} } }), {
            status: 404,
            headers: { 'content-type': 'application/json' },
          })
        : fetch(input, init);
    const client = createClient({ baseUrl: api.server.url, token: TOKEN, fetch: noStream });
    const { id } = await client.submit('flaky', { key: 'watch-poll' });
    const why: string[] = [];
    const seen: EventJson[] = [];
    const it = client.watch(id, { poll: { initialInterval: 50, maxInterval: 200 }, onFallback: (w) => why.push(w) });
    let r = await it.next();
    while (!r.done) {
      seen.push(r.value);
      r = await it.next();
    }
    expect(why).toEqual(['stream_not_served']);
    expect(r.value).toMatchObject({ outcome: 'ended', terminal: 'run_succeeded', via: 'poll' });
    expect(seen.map((e) => e.id)).toEqual((await allEvents(id)).map((e) => e.id));
  });

  it('the poller fallback ends with the terminal event even when a read holds it back behind an older open transaction', async () => {
    // A read in stream order takes only events older than the oldest transaction running on the
    // server (other databases' too: a parallel test run has many), and a held-back page has no next
    // cursor, like the last one. The run's state says it is over before its events can be read.
    const pg = await import('pg');
    const older = new pg.default.Client({ connectionString: db.url });
    await older.connect();
    await older.query('BEGIN');
    await older.query('SELECT pg_current_xact_id()'); // older than every transaction of the run below
    let id = '';
    let runOver = false;
    let readsAfter = 0;
    const watching: typeof fetch = async (input, init) => {
      const path = new URL(String(input)).pathname;
      if (path.endsWith('/stream'))
        return new Response(JSON.stringify({ error: { code: 'not_found', message: 'no route', path: null, details: {} } }), {
          status: 404,
          headers: { 'content-type': 'application/json' },
        });
      const res = await fetch(input, init);
      if (path === `/v1/runs/${id}` && res.ok && ((await res.clone().json()) as { state: string }).state === 'succeeded') runOver = true;
      else if (runOver && path === `/v1/runs/${id}/events`) readsAfter++;
      return res;
    };
    const client = createClient({ baseUrl: api.server.url, token: TOKEN, fetch: watching });
    ({ id } = await api.client.submit('echo', { key: 'poll-held-back' }));
    const seen: EventJson[] = [];
    const it = client.watch(id, { poll: { initialInterval: 20, maxInterval: 50, jitter: 0 } });
    const reading = (async () => {
      let r = await it.next();
      while (!r.done) {
        seen.push(r.value);
        r = await it.next();
      }
      return r.value;
    })();
    // The poller has seen the run over and read its events (none yet: all held back) at least twice.
    await until('reads of the events after the run ended', async () => readsAfter >= 2);
    expect(seen).toEqual([]);
    await older.query('COMMIT');
    await older.end();
    const end = await reading;
    expect(end).toMatchObject({ outcome: 'ended', terminal: 'run_succeeded', via: 'poll' });
    expect(seen.map((e) => e.id)).toEqual((await allEvents(id)).map((e) => e.id));
  });

  it('the poller fallback reads in stream order: an event committing after a higher id is not skipped', async () => {
    const noStream: typeof fetch = async (input, init) =>
      String(input).endsWith('/stream')
        ? new Response(JSON.stringify({ error: { code: 'not_found', message: 'no route', path: null, details: {} } }), {
            status: 404,
            headers: { 'content-type': 'application/json' },
          })
        : fetch(input, init);
    const client = createClient({ baseUrl: api.server.url, token: TOKEN, fetch: noStream });
    const { id } = await client.submit('gate', { key: 'poll-order' });
    await until('the gate stage running', async () => callsOf('gate', 'poll-order').length > 0);
    const seen: EventJson[] = [];
    const it = client.watch(id, { poll: { initialInterval: 20, maxInterval: 50, jitter: 0 } });
    const reading = (async () => {
      let r = await it.next();
      while (!r.done) {
        seen.push(r.value);
        r = await it.next();
      }
      return r.value;
    })();
    await until('the history so far', async () => seen.length >= 2);
    // T1 takes the lower id and stays open; T2 takes a higher id and commits first, while the poller polls.
    const pg = await import('pg');
    const c1 = new pg.default.Client({ connectionString: db.url });
    await c1.connect();
    await c1.query('BEGIN');
    const [low] = (
      await c1.query(`INSERT INTO ratchet.events (run_id, type, data) VALUES ($1, 'heartbeat_ok', '{"n":1}') RETURNING id::text`, [id])
    ).rows;
    const [high] = await db.query(
      `INSERT INTO ratchet.events (run_id, type, data) VALUES ($1, 'heartbeat_ok', '{"n":2}') RETURNING id::text`,
      [id],
    );
    expect(BigInt(high!.id)).toBeGreaterThan(BigInt(low!.id));
    await new Promise((r) => setTimeout(r, 400)); // several polls see the high id committed
    await c1.query('COMMIT');
    await c1.end();
    release('poll-order');
    const end = await reading;
    expect(end).toMatchObject({ outcome: 'ended', terminal: 'run_succeeded', via: 'poll' });
    const ids = seen.map((e) => e.id);
    expect(new Set(ids).size).toBe(ids.length);
    expect(ids).toContain(low!.id);
    expect([...ids].sort()).toEqual((await allEvents(id)).map((e) => e.id).sort());
  });

  it('GET /events?streamAfter: a foreign event id is a 422, an unknown run a 404', async () => {
    const { id } = await api.client.submit('flaky', { key: 'stream-after-bad' });
    await expect(api.client.events(id, { streamAfter: '999999999' })).rejects.toMatchObject({ status: 422 });
    await expect(api.client.events('01890f4e-0000-7000-8000-000000000000', { streamAfter: '0' })).rejects.toMatchObject({
      status: 404,
    });
  });

  it('an unknown run is an ApiError unknown_run, not a wait', async () => {
    const it = api.client.watch('01890f4e-0000-7000-8000-000000000000');
    await expect(it.next()).rejects.toMatchObject({ code: 'unknown_run', status: 404 });
  });
});
