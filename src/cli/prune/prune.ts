import { z } from 'zod';
import { DataDirLockedError, InvalidInputError } from '../../errors.js';
import {
  ageSchema,
  DEFAULT_PRUNE_BATCH,
  FINISHED_RUN_STATES,
  MAX_PRUNE_BATCH,
  openStore,
  type FinishedRunState,
  type PruneResult,
} from '../../store/index.js';
import { parseInput } from '../../store/validate.js';
import { cliLogger, printer, storeTarget, type GlobalOptions } from '../api/options.js';

export interface PruneArgs extends GlobalOptions {
  olderThan?: string;
  state?: string;
  dryRun: boolean;
  batchSize?: string;
}

const argsSchema = z.object({
  'older-than': ageSchema,
  state: z
    .string()
    .optional()
    .transform((v, ctx): FinishedRunState[] => {
      if (v === undefined) return [...FINISHED_RUN_STATES];
      const states = [
        ...new Set(
          v
            .split(',')
            .map((s) => s.trim())
            .filter(Boolean),
        ),
      ];
      const bad = states.filter((s) => !(FINISHED_RUN_STATES as readonly string[]).includes(s));
      if (states.length === 0 || bad.length > 0) {
        const what = bad.length > 0 ? `${bad.join(', ')}: not a finished state` : 'no state given';
        ctx.issues.push({
          code: 'custom',
          input: v,
          message: `${what}; prune deletes only finished runs: ${FINISHED_RUN_STATES.join(', ')}`,
        });
        return z.NEVER;
      }
      return states as FinishedRunState[];
    }),
  'batch-size': z
    .string()
    .optional()
    .transform((v, ctx): number => {
      if (v === undefined) return DEFAULT_PRUNE_BATCH;
      const n = Number(v);
      if (/^\d+$/.test(v.trim()) && n >= 1 && n <= MAX_PRUNE_BATCH) return n;
      ctx.issues.push({ code: 'custom', input: v, message: `must be a whole number in 1..${MAX_PRUNE_BATCH}` });
      return z.NEVER;
    }),
});

const summary = (r: PruneResult, olderThan: string, states: string[]) => {
  const what = `${r.runs} runs (${r.stages} stages, ${r.events} events): ${states.join(', ')} that finished more than ${olderThan} ago`;
  return r.dryRun
    ? `would prune ${what}; nothing deleted (--dry-run)`
    : `pruned ${what}, in ${r.batches} batch${r.batches === 1 ? '' : 'es'}${r.complete ? '' : ' (stopped early: more remain)'}`;
};

/**
 * Checks every argument before the store opens (a refusal deletes nothing and leaves no data
 * directory behind), then prunes and prints what went (or, with --dry-run, what would).
 */
export async function pruneCommand(o: PruneArgs): Promise<void> {
  if (o.olderThan === undefined) {
    throw new InvalidInputError('--older-than is required, e.g. --older-than 30d', 'older-than', { reason: 'missing' });
  }
  const args = parseInput(argsSchema, { 'older-than': o.olderThan, state: o.state, 'batch-size': o.batchSize }, 'prune');
  const started = Date.now();
  let store;
  try {
    store = await openStore({ ...storeTarget(o), logger: cliLogger() });
  } catch (err) {
    if (err instanceof DataDirLockedError) {
      throw new DataDirLockedError(err.dataDir, `${err.holder}; stop it first (prune needs the database itself)`);
    }
    throw err;
  }
  try {
    const olderThan = Object.fromEntries(args.state.map((s) => [s, args['older-than']]));
    const r = await store.prune({ olderThan, batchSize: args['batch-size'], dryRun: o.dryRun });
    printer(o)(
      {
        dryRun: r.dryRun,
        olderThan: o.olderThan,
        olderThanMs: args['older-than'],
        states: args.state,
        runs: r.runs,
        stages: r.stages,
        events: r.events,
        batches: r.batches,
        complete: r.complete,
        byState: r.byState,
        durationMs: Date.now() - started,
      },
      () => summary(r, o.olderThan!, args.state),
    );
  } finally {
    await store.close();
  }
}
