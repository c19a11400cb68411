import { EventEmitter } from 'node:events';
import type { AssistantMessage } from '../agent/model-output.js';
import { callModel } from '../agent/model-client.js';
import type { ChatMessage } from '../agent/messages.js';
import type { ModelSpec, Tool } from '../definitions/types.js';
import type { Db } from '../store/db.js';
import type { ClaimedStage } from '../store/lease.js';

/**
 * Token streaming (issue 12): a model stage whose model has `stream: true` passes the pieces of
 * its answer to the run's watchers as they arrive. They are NOT events: nothing is stored (the
 * answer is persisted once, by the stage's finish, as before), they carry no event id (so
 * Last-Event-ID resumption stays exact), and a watcher that was not connected misses them.
 *
 * How they travel from the worker to the API process that serves the stream:
 * - PostgreSQL: NOTIFY on channel `ratchet_tokens` (outside any transaction, so at once). The
 *   worker and the API are usually different processes, and PostgreSQL is the one thing they
 *   surely share (Redis is optional); the API's event hub already holds a LISTEN connection
 *   per process, a second one for this channel fans the pieces out to every watcher. Pieces are
 *   coalesced (one NOTIFY per TOKEN_FLUSH_MS or per ~TOKEN_CHUNK_CHARS) and kept far below
 *   NOTIFY's 8000-byte payload limit.
 * - PGlite (embedded): one process owns the data directory, so worker and API share memory —
 *   an in-process bus; PGlite's own LISTEN would only add a hop.
 * Pieces are best effort: a failed NOTIFY is dropped, never retried, and never fails the stage.
 */
export const TOKENS_CHANNEL = 'ratchet_tokens';
export const TOKEN_FLUSH_MS = 50;
/** Characters per NOTIFY at most: JSON-escaped and UTF-8 encoded, still under 8000 bytes. */
export const TOKEN_CHUNK_CHARS = 1000;

/** One piece of a model stage's answer, as watchers get it (SSE `event: token`). */
export interface TokenDelta {
  runId: string;
  stageId: string;
  fence: string;
  attempt: number;
  /** Position of this piece within its attempt's stream (0, 1, ...): a gap means pieces were lost. */
  index: number;
  text: string;
}

/** The embedded store's in-process bus (see above). */
const localBus = new EventEmitter();
localBus.setMaxListeners(0);
export function onLocalTokens(fn: (t: TokenDelta) => void): () => void {
  localBus.on('token', fn);
  return () => localBus.off('token', fn);
}

/** The wire form of a piece on NOTIFY (short keys). */
export function encodeToken(t: TokenDelta): string {
  return JSON.stringify({ r: t.runId, s: t.stageId, f: t.fence, a: t.attempt, i: t.index, t: t.text });
}
export function decodeToken(payload: string): TokenDelta | null {
  try {
    const p = JSON.parse(payload) as { r?: unknown; s?: unknown; f?: unknown; a?: unknown; i?: unknown; t?: unknown };
    if (typeof p.r !== 'string' || typeof p.s !== 'string' || typeof p.f !== 'string' || typeof p.t !== 'string') return null;
    if (typeof p.a !== 'number' || typeof p.i !== 'number') return null;
    return { runId: p.r, stageId: p.s, fence: p.f, attempt: p.a, index: p.i, text: p.t };
  } catch {
    return null;
  }
}

/** Collects a stage's pieces and sends them, in order, coalesced; close() sends what is left. */
export function tokenPublisher(db: Db, stage: Pick<ClaimedStage, 'runId' | 'id' | 'fence' | 'attempt'>) {
  let buffer = '';
  let index = 0;
  let timer: NodeJS.Timeout | null = null;
  let chain: Promise<void> = Promise.resolve();
  const send = (text: string) => {
    const t: TokenDelta = { runId: stage.runId, stageId: stage.id, fence: stage.fence, attempt: stage.attempt, index: index++, text };
    if (db.kind === 'pglite' || !db.listen) {
      localBus.emit('token', t);
      return;
    }
    chain = chain
      .then(() => db.query('SELECT pg_notify($1, $2)', [TOKENS_CHANNEL, encodeToken(t)], 'ratchet_token_notify'))
      .then(
        () => {},
        () => {}, // best effort: a lost piece is a gap in `index`, never the stage's failure
      );
  };
  const flush = () => {
    if (timer) clearTimeout(timer);
    timer = null;
    while (buffer.length > 0) {
      // Never split a surrogate pair.
      let n = Math.min(TOKEN_CHUNK_CHARS, buffer.length);
      const last = buffer.charCodeAt(n - 1);
      if (n < buffer.length && last >= 0xd800 && last <= 0xdbff) n--;
      send(buffer.slice(0, n));
      buffer = buffer.slice(n);
    }
  };
  return {
    push(text: string) {
      buffer += text;
      if (buffer.length >= TOKEN_CHUNK_CHARS) flush();
      else if (!timer) {
        timer = setTimeout(flush, TOKEN_FLUSH_MS);
        timer.unref();
      }
    },
    /** Sends what is buffered; resolves once every NOTIFY was answered or dropped, or after 1 s at most (the finish never waits longer). */
    async close() {
      flush();
      let t: NodeJS.Timeout | undefined;
      await Promise.race([chain, new Promise<void>((r) => (t = setTimeout(r, 1000)))]);
      clearTimeout(t);
    },
  };
}

/**
 * The executor's model call (its hook): callModel, streaming the answer's pieces to watchers
 * when the model asks for it (`stream: true`). The answer it returns is the same either way.
 */
export async function callModelStreamed(
  db: Db,
  stage: ClaimedStage,
  spec: ModelSpec,
  messages: ChatMessage[],
  tools: readonly Tool[],
  signal: AbortSignal,
  timeoutMs: number,
): Promise<AssistantMessage> {
  if (!spec.stream) return callModel(spec, messages, tools, signal, timeoutMs);
  const pub = tokenPublisher(db, stage);
  try {
    return await callModel(spec, messages, tools, signal, timeoutMs, (t) => pub.push(t));
  } finally {
    await pub.close();
  }
}
