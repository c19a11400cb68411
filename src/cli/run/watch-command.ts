import { eventToJson } from '../../api/present.js';
import { eventPositionSchema, type RunJson } from '../../api/schemas.js';
import { createRunService } from '../../api/service.js';
import { createClient } from '../../client/client.js';
import type { EventJson, TokenJson, WatchEnd } from '../../client/watch.js';
import { resolveDuration } from '../../definitions/duration.js';
import { createRatchet } from '../../engine.js';
import { InvalidInputError } from '../../errors.js';
import { createEventHub } from '../../live/hub.js';
import { openRunStream } from '../../live/run-stream.js';
import { TERMINAL_EVENT_TYPES } from '../../planner/states.js';
import { errorText } from '../api/format.js';
import { bearerToken, cliLogger, serverUrl, storeTarget, type GlobalOptions } from '../api/options.js';
import { EXIT } from '../exit-codes.js';
import { createFollower } from './follow.js';
import { followWatch } from './remote.js';

export interface WatchCommandOptions extends GlobalOptions {
  timeout: string;
  after?: string;
  stages: boolean;
  /** Print a streaming model's pieces as they arrive (text; --json: `{"type":"token",...}` lines). */
  tokens?: boolean;
}

/** The database directly: the same stream the server sends, read in this process. */
async function* fromStore(
  o: WatchCommandOptions,
  id: string,
  deadlineMs: number,
  signal: AbortSignal,
  getRun: { fn?: () => Promise<RunJson>; final?: RunJson },
  onToken?: (t: TokenJson) => void,
): AsyncGenerator<EventJson, WatchEnd> {
  const ratchet = await createRatchet({ ...storeTarget(o), workflows: [], logger: cliLogger() });
  const hub = createEventHub(ratchet.store.db);
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), deadlineMs);
  const stop = () => ac.abort();
  signal.addEventListener('abort', stop);
  const service = createRunService(ratchet);
  getRun.fn = () => service.get(id);
  let last: string | null = o.after ?? null;
  let terminal: string | null = null;
  try {
    const stream = await openRunStream(ratchet.store.db, hub, id, { ...(o.after ? { afterEventId: o.after } : {}), signal: ac.signal });
    if (stream) {
      for await (const item of stream) {
        if (item.kind === 'token') {
          const { stageId, fence, attempt, index, text } = item.token;
          onToken?.({ stageId, fence, attempt, index, text });
        }
        if (item.kind !== 'event') continue;
        const e = eventToJson(item.event);
        last = e.id;
        terminal = TERMINAL_EVENT_TYPES.includes(e.type) ? e.type : e.type === 'run_retried' ? null : terminal;
        yield e;
      }
    }
    const outcome = !ac.signal.aborted ? 'ended' : signal.aborted ? 'aborted' : 'client_deadline_exceeded';
    getRun.final = await service.get(id);
    return { outcome, terminal, lastEventId: last, via: 'stream', reconnects: 0 };
  } finally {
    clearTimeout(timer);
    signal.removeEventListener('abort', stop);
    await hub.close();
    await ratchet.close();
  }
}

export async function watchCommand(id: string, o: WatchCommandOptions): Promise<void> {
  const timeout = resolveDuration(o.timeout);
  if ('problem' in timeout || timeout.ms <= 0)
    throw new InvalidInputError(`--timeout: ${'problem' in timeout ? timeout.problem : 'must be > 0'}`, 'timeout');
  const after = o.after === undefined ? undefined : eventPositionSchema.safeParse(o.after);
  if (after?.success === false) throw new InvalidInputError(`--after must be ${after.error.issues[0]!.message}`, 'after');
  const interrupt = new AbortController();
  const onSignal = () => interrupt.abort();
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  // --tokens in text mode: pieces go on the current line; the next line written starts a new one.
  let midLine = false;
  const write = (l: string) => {
    process.stdout.write(midLine ? `\n${l}` : l);
    midLine = false;
  };
  const onToken = o.tokens
    ? (t: TokenJson) => {
        if (o.json) write(`${JSON.stringify({ type: 'token', ...t })}\n`);
        else {
          process.stdout.write(t.text);
          midLine = t.text.length > 0 && !t.text.endsWith('\n');
        }
      }
    : undefined;
  const out = (obj: Record<string, unknown>, text: string) => write(o.json ? `${JSON.stringify(obj)}\n` : `${text}\n`);
  try {
    const url = serverUrl(o);
    const client = url ? createClient({ baseUrl: url, token: bearerToken(o) }) : null;
    const local: { fn?: () => Promise<RunJson>; final?: RunJson } = {};
    const getRun = () => (client ? client.get(id) : local.fn!());
    const watch = client
      ? client.watch(id, {
          deadline: timeout.ms,
          signal: interrupt.signal,
          ...(o.after ? { after: o.after } : {}),
          poll: { initialInterval: 250, maxInterval: 5000 },
          ...(onToken ? { onToken } : {}),
        })
      : fromStore(o, id, timeout.ms, interrupt.signal, local, onToken);
    const follow = createFollower({ json: o.json, write }, getRun, o.stages ? 'stages' : 'events');
    const w = await followWatch(watch, (e) => follow.event(e));
    const run: RunJson | null = client ? await client.get(id).catch(() => null) : (local.final ?? null);
    const state = run?.state ?? null;
    if (w.outcome !== 'ended') {
      out(
        { type: 'watch_end', runId: id, outcome: w.outcome, state, lastEventId: w.lastEventId },
        `stopped watching run ${id} (${w.outcome === 'aborted' ? 'interrupted' : '--timeout passed'}); it is ${state ?? 'unknown'} and goes on`,
      );
      process.exitCode = w.outcome === 'aborted' ? EXIT.interrupted : EXIT.runTimeout;
      return;
    }
    out(
      {
        type: 'watch_end',
        runId: id,
        outcome: 'ended',
        state,
        result: state === 'succeeded' ? run!.result : null,
        error: run?.error ?? null,
        lastEventId: w.lastEventId,
        via: w.via,
      },
      `run ${id} ${state ?? 'ended'}${state === 'succeeded' ? `: ${JSON.stringify(run!.result)}` : run?.error ? `: ${errorText(run.error)}` : ''}`,
    );
    process.exitCode = state === 'succeeded' ? EXIT.ok : EXIT.runFailed;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}
