import { createClient } from '../../client/client.js';
import type { EventJson, WatchEnd } from '../../client/watch.js';
import { EXIT } from '../exit-codes.js';
import { priorityOption } from './priority-option.js';
import { bearerToken, serverUrl, type GlobalOptions } from '../api/options.js';
import { errorText } from '../api/format.js';
import { createFollower } from './follow.js';

export interface RemoteRunOptions extends GlobalOptions {
  idempotencyKey?: string;
  priority?: string;
  wait: boolean;
}

/**
 * `ratchet run --url <server> <workflow>`: submit through the task API (an idempotency key is
 * made when none is given, and printed, so a lost answer can be resubmitted safely); with
 * --wait, watch its live stream (client.watch: reconnects, falls back to the bounded poller), printing each stage as it changes, until
 * it ends (exit 0 succeeded, 5 failed / cancelled / expired) or --timeout passes (exit 6: the
 * run goes on, only the watching stopped).
 */
export async function runRemote(
  workflow: string,
  input: unknown,
  o: RemoteRunOptions,
  watch: { timeoutMs: number; signal: AbortSignal },
): Promise<void> {
  const out = (obj: Record<string, unknown>, text: string) => process.stdout.write(o.json ? `${JSON.stringify(obj)}\n` : `${text}\n`);
  const client = createClient({ baseUrl: serverUrl(o)!, token: bearerToken(o) });
  const started = Date.now();
  const sub = await client.submit(workflow, input, {
    ...(o.idempotencyKey ? { idempotencyKey: o.idempotencyKey } : {}),
    ...priorityOption(o.priority),
  });
  out(
    {
      type: 'run_submitted',
      runId: sub.id,
      workflow,
      state: sub.state,
      created: sub.created,
      idempotencyKey: sub.idempotencyKey,
      backend: client.baseUrl,
    },
    `run ${sub.id} ${workflow} ${sub.created ? 'submitted' : 'already submitted (same idempotency key)'} to ${client.baseUrl} (idempotency key ${sub.idempotencyKey})`,
  );
  if (!o.wait) return;
  const follow = createFollower({ json: o.json, write: (l) => process.stdout.write(l) }, () => client.get(sub.id), 'stages');
  const w = await followWatch(
    client.watch(sub.id, {
      deadline: watch.timeoutMs,
      signal: watch.signal,
      poll: { initialInterval: 250, factor: 1.5, maxInterval: 5000 },
    }),
    (e) => follow.event(e),
  );
  if (w.outcome !== 'ended') {
    const state = (await client.get(sub.id).catch(() => null))?.state ?? null;
    out(
      {
        type: w.outcome === 'aborted' ? 'run_watch_interrupted' : 'run_watch_timeout',
        runId: sub.id,
        state,
        reason: w.outcome === 'aborted' ? 'aborted' : 'deadline',
      },
      `stopped watching run ${sub.id} (${w.outcome === 'aborted' ? 'interrupted' : '--timeout passed'}); it is ${state ?? 'unknown'} and goes on`,
    );
    process.exitCode = w.outcome === 'aborted' ? EXIT.interrupted : EXIT.runTimeout;
    return;
  }
  const run = await client.get(sub.id);
  out(
    {
      type: 'run_finished',
      runId: sub.id,
      workflow,
      state: run.state,
      result: run.state === 'succeeded' ? run.result : null,
      error: run.error,
      durationMs: Date.now() - started,
    },
    `run ${sub.id} ${run.state} in ${((Date.now() - started) / 1000).toFixed(1)}s\n${run.state === 'succeeded' ? JSON.stringify(run.result, null, 2) : `error: ${errorText(run.error)}`}`,
  );
  process.exitCode = run.state === 'succeeded' ? EXIT.ok : EXIT.runFailed;
}

/** Drains a watch, handing each event on; returns how the watch ended. */
export async function followWatch(watch: AsyncGenerator<EventJson, WatchEnd>, onEvent: (e: EventJson) => Promise<void>): Promise<WatchEnd> {
  for (;;) {
    const r = await watch.next();
    if (r.done) return r.value;
    await onEvent(r.value);
  }
}
