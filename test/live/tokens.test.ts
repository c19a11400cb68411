import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { watchCommand } from '../../src/cli/run/watch-command.js';
import { z } from 'zod';
import { startScriptedModel, type ScriptedModel } from '../../src/agent/scripted-model.js';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { createClient, type TokenJson } from '../../src/client/index.js';
import { createSseParser, type SseMessage } from '../../src/client/sse.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { decodeToken, encodeToken } from '../../src/live/tokens.js';
import { silentLogger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * Token streaming: a model with `stream: true` passes the pieces of its answer to the run's
 * watchers as they arrive (SSE `event: token`, no id), through NOTIFY on PostgreSQL and an
 * in-process bus on PGlite; the answer is persisted once, as before, and no piece is an event.
 * The scripted model streams word by word and holds its answer after the first word until a
 * watcher has that word: the pieces arrive while the call is still open.
 */
const TOKEN = 'tokens-token-0123456789';
const ANSWER = 'Streaming works: every word arrives before the answer is stored.';
const io = defineToolClass({ name: 'tok-io', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' });
// The call's timeout outlasts both of the scripted model's bounded waits (10 s each): a loaded machine slows the watchers,
// never times out the one attempt the assertions are about.
const llm = defineToolClass({ name: 'tok-llm', lease: '5s', heartbeat: '1s', jitter: '200ms', timeout: '25s', maxDuration: '60s' });
const noop = defineTool({
  name: 'noop',
  description: 'nothing',
  class: io,
  input: z.object({}),
  output: z.object({}),
  run: async () => ({}),
});

interface Setup {
  ratchet: Ratchet;
  server: ApiServer;
  model: ScriptedModel;
  /** Resolved by the test when a watcher got the first piece; the model waits for it. */
  firstSeen: { promise: Promise<void>; resolve: () => void };
  /** Resolved by the test when its watcher is connected (it got an event); the model waits before answering. */
  ready: { promise: Promise<void>; resolve: () => void };
  close(): Promise<void>;
}

function gate() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

async function setup(target: { databaseUrl: string } | { dataDir: string }): Promise<Setup> {
  let firstSeen = gate();
  let ready = gate();
  const model = await startScriptedModel({
    script: () => ({ content: ANSWER, usage: { prompt_tokens: 7, completion_tokens: 11 } }),
    beforeAnswer: async () => {
      await Promise.race([ready.promise, new Promise((r) => setTimeout(r, 10_000))]);
    },
    // Bounded: if no watcher ever sees a piece, the answer goes on and the assertions say why.
    afterChunk: async (_i, chunk) => {
      if (chunk === 0) await Promise.race([firstSeen.promise, new Promise((r) => setTimeout(r, 10_000))]);
    },
  });
  const agent = defineAgent({
    name: 'streamer',
    input: z.object({ ask: z.string() }),
    model: { name: 'scripted-stream', class: llm, baseURL: model.baseURL, stream: true },
    instructions: 'answer',
    tools: [noop],
  });
  const ratchet = await createRatchet({ ...target, workflows: [agent], logger: silentLogger() });
  await ratchet.worker({ pollIntervalMs: 50 }).start();
  const server = await createServer({ ratchet, tokens: [TOKEN], port: 0 });
  const s: Setup = {
    ratchet,
    server,
    model,
    get firstSeen() {
      return firstSeen;
    },
    set firstSeen(g) {
      firstSeen = g;
    },
    get ready() {
      return ready;
    },
    set ready(g) {
      ready = g;
    },
    async close() {
      await server.close();
      await ratchet.close();
      await model.close();
    },
  };
  return s;
}

/** Reads the raw stream of run `id` to its end: every SSE message as sent. */
async function rawStream(url: string, id: string, onMessage: (m: SseMessage) => void, lastEventId?: string): Promise<SseMessage[]> {
  const headers: Record<string, string> = { authorization: `Bearer ${TOKEN}`, accept: 'text/event-stream' };
  if (lastEventId) headers['last-event-id'] = lastEventId;
  const res = await fetch(`${url}/v1/runs/${id}/stream`, { headers });
  if (res.status === 204) return [];
  const parser = createSseParser();
  const decoder = new TextDecoder();
  const out: SseMessage[] = [];
  const reader = res.body!.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    for (const m of parser.push(decoder.decode(value, { stream: true }))) {
      out.push(m);
      onMessage(m);
    }
  }
  return out;
}

async function streamedRun(s: Setup, hold = true) {
  s.firstSeen = gate();
  s.ready = gate();
  if (!hold) {
    s.firstSeen.resolve();
    s.ready.resolve();
  }
  const client = createClient({ baseUrl: s.server.url, token: TOKEN });
  const { id } = await client.submit('streamer', { ask: 'go' });
  // Two watchers: the client's watch() with onToken, and a raw reader that keeps every message.
  const order: string[] = [];
  const tokens: TokenJson[] = [];
  const watched = (async () => {
    for await (const e of client.watch(id, {
      onToken: (t) => {
        tokens.push(t);
        order.push('token');
        s.firstSeen.resolve();
      },
    })) {
      order.push(e.type);
      s.ready.resolve();
    }
  })();
  const raw = await rawStream(s.server.url, id, () => {});
  await watched;
  const run = await client.get(id);
  const events = (await client.events(id)).events;
  return { id, run, events, raw, tokens, order, client };
}

function expectStreamed(r: Awaited<ReturnType<typeof streamedRun>>) {
  expect(r.run.state).toBe('succeeded');
  // The answer persisted once, as without streaming.
  expect(r.run.result).toEqual({ answer: ANSWER });
  expect(r.run.usage).toMatchObject({ inputTokens: 7, outputTokens: 11, modelCalls: 1 });
  // The pieces, put together, are the answer; in order, no gap, all of the model stage's attempt.
  expect(r.tokens.map((t) => t.text).join('')).toBe(ANSWER);
  expect(r.tokens.map((t) => t.index)).toEqual(r.tokens.map((_t, i) => i));
  const model = r.run.stages.find((st) => st.tool === '$model')!;
  for (const t of r.tokens) expect([t.stageId, t.fence, t.attempt]).toEqual([model.id, model.fence, 1]);
  // As they arrived: before the stage's answer was committed (stage_succeeded), so it held the call open.
  expect(r.order.indexOf('token')).toBeGreaterThan(-1);
  expect(r.order.indexOf('token')).toBeLessThan(r.order.indexOf('stage_succeeded'));
  // On the wire: `event: token` without an id; events with theirs, each once, in the table's order.
  const tokenMsgs = r.raw.filter((m) => m.event === 'token');
  expect(tokenMsgs.length).toBeGreaterThan(0);
  for (const m of tokenMsgs) expect(m.id).toBeNull();
  expect(r.raw.filter((m) => m.event === 'message').map((m) => m.id)).toEqual(r.events.map((e) => e.id));
  // Nothing about pieces is stored: no event carries them.
  expect(JSON.stringify(r.events)).not.toContain('Streaming works');
}

describe('token streaming on PostgreSQL (NOTIFY)', () => {
  let db: TestDatabase;
  let s: Setup;
  beforeAll(async () => {
    db = await createTestDatabase('tokens');
    s = await setup({ databaseUrl: db.url });
    // The API's token LISTEN opens at the first watcher and stays: a first run (not checked) makes
    // sure it is up before the run under test, whose first piece would otherwise race it.
    await streamedRun(s, false);
  });
  afterAll(async () => {
    await s?.close();
    await db?.drop();
  });

  it('pieces reach the watchers live, as `event: token` without ids; the answer is persisted once', async () => {
    const r = await streamedRun(s);
    expectStreamed(r);
    const [ev] = await db.query(`SELECT count(*)::int AS n FROM ratchet.events WHERE run_id = $1 AND data::text LIKE '%Streaming works%'`, [
      r.id,
    ]);
    expect(ev!.n).toBe(0);
    // Resuming with Last-Event-ID after the run ended: the events after it, exactly; pieces are not replayed.
    const mid = r.events[1]!.id;
    const resumed = await rawStream(s.server.url, r.id, () => {}, mid);
    expect(resumed.filter((m) => m.event === 'token')).toEqual([]);
    expect(resumed.filter((m) => m.event === 'message').map((m) => m.id)).toEqual(r.events.slice(2).map((e) => e.id));
  });

  it('ratchet watch --tokens --json: token lines as they arrive, between the event lines', async () => {
    s.firstSeen = gate();
    s.ready = gate();
    const client = createClient({ baseUrl: s.server.url, token: TOKEN });
    const { id } = await client.submit('streamer', { ask: 'cli' });
    const lines: Record<string, unknown>[] = [];
    let partial = '';
    const spy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
      partial += String(chunk);
      for (let nl = partial.indexOf('\n'); nl >= 0; nl = partial.indexOf('\n')) {
        const line = JSON.parse(partial.slice(0, nl)) as Record<string, unknown>;
        partial = partial.slice(nl + 1);
        lines.push(line);
        if (line.type === 'token') s.firstSeen.resolve();
        else s.ready.resolve();
      }
      return true;
    });
    try {
      await watchCommand(id, { url: s.server.url, token: TOKEN, json: true, tokens: true, timeout: '60s', stages: false });
    } finally {
      spy.mockRestore();
    }
    const tokens = lines.filter((l) => l.type === 'token');
    expect(tokens.map((t) => t.text).join('')).toBe(ANSWER);
    const types = lines.map((l) => l.type);
    expect(types.indexOf('token')).toBeLessThan(types.indexOf('stage_succeeded'));
    expect(types.at(-1)).toBe('watch_end');
    expect(lines.at(-1)).toMatchObject({ state: 'succeeded', result: { answer: ANSWER } });
  });

  it('the NOTIFY payload round-trips and stays far under 8000 bytes', () => {
    const t = { runId: 'r', stageId: '1', fence: '2', attempt: 1, index: 0, text: '"\u00e9\u{1F600}'.repeat(300) };
    expect(decodeToken(encodeToken(t))).toEqual(t);
    expect(Buffer.byteLength(encodeToken({ ...t, text: '\u{1F600}'.repeat(500) }))).toBeLessThan(8000);
    expect(decodeToken('not json')).toBeNull();
  });
});

describe('token streaming on PGlite (in-process bus)', () => {
  let s: Setup;
  beforeAll(async () => {
    s = await setup({ dataDir: ':memory:' });
  });
  afterAll(async () => {
    await s?.close();
  });

  it('the same pieces, live, through the in-process bus', async () => {
    expectStreamed(await streamedRun(s));
  });
});
