import type { RunView } from '../../engine.js';
import { TERMINAL_RUN_STATES } from '../../planner/states.js';

export type StageView = RunView['stages'][number];

export type WatchOutcome =
  | { kind: 'finished'; run: RunView }
  | { kind: 'timeout'; run: RunView }
  | { kind: 'interrupted'; run: RunView | null };

export interface WatchOptions {
  /** How often to read the run (ms). */
  intervalMs: number;
  /** Stop watching after this long (ms); the run is left as it is. */
  timeoutMs: number;
  /** Called once for each stage whose state or attempt changed since the last read, in seq order. */
  onStage(stage: StageView, run: RunView): void;
  /** Aborting stops the watch (SIGINT). */
  signal?: AbortSignal;
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });

/**
 * Polls a run until it is terminal, reporting each stage as it advances. A poll sees states,
 * not transitions: a stage that went queued → running → succeeded between two reads is
 * reported once, as succeeded.
 */
export async function watchRun(getRun: (id: string) => Promise<RunView | null>, id: string, opts: WatchOptions): Promise<WatchOutcome> {
  const seen = new Map<number, string>();
  const until = Date.now() + opts.timeoutMs;
  let last: RunView | null = null;
  for (;;) {
    if (opts.signal?.aborted) return { kind: 'interrupted', run: last };
    const run = await getRun(id);
    if (!run) throw new Error(`run ${id} vanished while it was watched`);
    last = run;
    for (const stage of run.stages) {
      const key = `${stage.state}/${stage.attempt}`;
      if (seen.get(stage.seq) === key || (stage.state === 'pending' && !seen.has(stage.seq))) continue;
      seen.set(stage.seq, key);
      opts.onStage(stage, run);
    }
    if (TERMINAL_RUN_STATES.includes(run.state)) return { kind: 'finished', run };
    if (Date.now() >= until) return { kind: 'timeout', run };
    await sleep(Math.min(opts.intervalMs, Math.max(0, until - Date.now())), opts.signal);
  }
}
