import type { RunView } from '../../engine.js';
import { depsText } from '../api/format.js';
import type { StageView } from './watch.js';

/**
 * What `ratchet run` prints on stdout: text lines for people, or (with --json) one JSON object
 * per line, each with a `type`: run_submitted, stage, run_finished, run_watch_timeout,
 * run_watch_interrupted (and services_started with --with-services).
 */
export interface RunReporter {
  services(url: string, storage: string): void;
  submitted(run: { id: string; workflow: string; state: string; created: boolean; backend: string }): void;
  /** `deps`: the names of the stages it waits for (the run graph). */
  stage(runId: string, stage: StageView, deps?: readonly string[]): void;
  finished(run: RunView, durationMs: number): void;
  stopped(kind: 'timeout' | 'interrupted', runId: string, run: RunView | null): void;
}

const errorText = (e: unknown): string => {
  const { code, message } = (e ?? {}) as { code?: unknown; message?: unknown };
  return typeof message === 'string' ? `${typeof code === 'string' ? `${code}: ` : ''}${message}` : JSON.stringify(e);
};

export function jsonReporter(write: (line: string) => void): RunReporter {
  const out = (o: Record<string, unknown>) => write(`${JSON.stringify(o)}\n`);
  return {
    services: (url, storage) => out({ type: 'services_started', url, storage }),
    submitted: (r) =>
      out({ type: 'run_submitted', runId: r.id, workflow: r.workflow, state: r.state, created: r.created, backend: r.backend }),
    stage: (runId, s, deps = []) =>
      out({
        type: 'stage',
        runId,
        seq: s.seq,
        name: s.name,
        tool: s.tool,
        state: s.state,
        attempt: s.attempt,
        fence: s.fence,
        deps,
        ...(s.lastError ? { lastError: s.lastError } : {}),
      }),
    finished: (run, durationMs) =>
      out({
        type: 'run_finished',
        runId: run.id,
        workflow: run.workflow,
        state: run.state,
        result: run.result,
        error: run.error,
        durationMs,
      }),
    stopped: (kind, runId, run) =>
      out({ type: kind === 'timeout' ? 'run_watch_timeout' : 'run_watch_interrupted', runId, state: run?.state ?? null }),
  };
}

export function textReporter(write: (line: string) => void): RunReporter {
  const line = (s: string) => write(`${s}\n`);
  return {
    services: (url, storage) => line(`example services on ${url} (${storage})`),
    submitted: (r) =>
      line(`run ${r.id} ${r.workflow} ${r.created ? 'submitted' : 'already submitted (same idempotency key)'} on ${r.backend}`),
    stage: (_runId, s, deps = []) =>
      line(
        `  stage ${s.seq} ${s.tool.padEnd(18)} ${s.state.padEnd(9)} attempt ${s.attempt}  fence ${s.fence ?? '-'}  deps ${depsText(deps)}` +
          (s.lastError && s.state !== 'succeeded' ? `  (${errorText(s.lastError)})` : ''),
      ),
    finished: (run, durationMs) => {
      line(`run ${run.id} ${run.state} in ${(durationMs / 1000).toFixed(1)}s`);
      if (run.state === 'succeeded') line(JSON.stringify(run.result, null, 2));
      else line(`error: ${errorText(run.error)}`);
    },
    stopped: (kind, runId, run) =>
      line(
        kind === 'timeout'
          ? `stopped watching run ${runId} (--timeout passed); it is ${run?.state ?? 'unknown'} and left as it is`
          : `interrupted: run ${runId} is left unfinished (it was ${run?.state ?? 'unknown'}); a worker on the same database resumes it`,
      ),
  };
}
