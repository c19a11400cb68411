import { createClient } from '../../client/client.js';
import type { RunJson } from '../../api/schemas.js';
import { EXIT } from '../exit-codes.js';
import { priorityOption } from './priority-option.js';
import { bearerToken, serverUrl, type GlobalOptions } from '../api/options.js';
import { errorText } from '../api/format.js';

export interface RemoteRunOptions extends GlobalOptions {
  idempotencyKey?: string;
  priority?: string;
  wait: boolean;
}

/**
 * `ratchet run --url <server> <workflow>`: submit through the task API (an idempotency key is
 * made when none is given, and printed, so a lost answer can be resubmitted safely); with
 * --wait, watch it with the client's bounded poller, printing each stage as it changes, until
 * it ends (exit 0 succeeded, 5 failed / cancelled / expired) or --timeout passes (exit 6: the
 * run goes on, only the watching stopped).
 */
export async function runRemote(workflow: string, input: unknown, o: RemoteRunOptions, watch: { timeoutMs: number; signal: AbortSignal }): Promise<void> {
  const out = (obj: Record<string, unknown>, text: string) => process.stdout.write(o.json ? `${JSON.stringify(obj)}\n` : `${text}\n`);
  const client = createClient({ baseUrl: serverUrl(o)!, token: bearerToken(o) });
  const started = Date.now();
  const sub = await client.submit(workflow, input, { ...(o.idempotencyKey ? { idempotencyKey: o.idempotencyKey } : {}), ...priorityOption(o.priority) });
  out({ type: 'run_submitted', runId: sub.id, workflow, state: sub.state, created: sub.created, idempotencyKey: sub.idempotencyKey, backend: client.baseUrl },
    `run ${sub.id} ${workflow} ${sub.created ? 'submitted' : 'already submitted (same idempotency key)'} to ${client.baseUrl} (idempotency key ${sub.idempotencyKey})`);
  if (!o.wait) return;
  const seen = new Map<number, string>();
  const onRun = (run: RunJson) => {
    for (const s of run.stages) {
      const key = `${s.state}/${s.attempt}`;
      if (seen.get(s.seq) === key || (s.state === 'pending' && !seen.has(s.seq))) continue;
      seen.set(s.seq, key);
      out({ type: 'stage', runId: run.id, seq: s.seq, name: s.name, tool: s.tool, state: s.state, attempt: s.attempt, fence: s.fence, ...(s.lastError ? { lastError: s.lastError } : {}) },
        `  stage ${s.seq} ${s.tool.padEnd(18)} ${s.state.padEnd(9)} attempt ${s.attempt}  fence ${s.fence ?? '-'}` + (s.lastError && s.state !== 'succeeded' ? `  (${errorText(s.lastError)})` : ''));
    }
  };
  const w = await client.wait(sub.id, { deadline: watch.timeoutMs, initialInterval: 250, factor: 1.5, maxInterval: 5000, signal: watch.signal, onRun });
  if (w.outcome === 'client_deadline_exceeded') {
    out({ type: w.reason === 'aborted' ? 'run_watch_interrupted' : 'run_watch_timeout', runId: sub.id, state: w.state, reason: w.reason },
      `stopped watching run ${sub.id} (${w.reason === 'aborted' ? 'interrupted' : w.reason === 'max_polls' ? 'polls used up' : '--timeout passed'}); it is ${w.state ?? 'unknown'} and goes on`);
    process.exitCode = w.reason === 'aborted' ? EXIT.interrupted : EXIT.runTimeout;
    return;
  }
  out({ type: 'run_finished', runId: sub.id, workflow, state: w.state, result: w.result, error: w.error, durationMs: Date.now() - started },
    `run ${sub.id} ${w.state} in ${((Date.now() - started) / 1000).toFixed(1)}s\n${w.outcome === 'succeeded' ? JSON.stringify(w.result, null, 2) : `error: ${errorText(w.error)}`}`);
  process.exitCode = w.outcome === 'succeeded' ? EXIT.ok : EXIT.runFailed;
}
