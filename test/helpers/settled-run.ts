import type { Ratchet, RunView } from '../../src/engine.js';
import { TERMINAL_RUN_STATES } from '../../src/planner/states.js';

/** Polls the run every 50 ms until it is terminal; throws with the run as last seen after `timeoutMs`. */
export async function settledRun(r: Ratchet, id: string, timeoutMs: number): Promise<RunView> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const run = await r.getRun(id);
    if (run && TERMINAL_RUN_STATES.includes(run.state)) return run;
    if (Date.now() > end) throw new Error(`run ${id} did not settle: ${JSON.stringify(run)}`);
    await new Promise((res) => setTimeout(res, 50));
  }
}
