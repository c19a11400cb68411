import type { Command } from 'commander';
import type { PruneArgs } from '../prune/prune.js';

/**
 * `ratchet prune --older-than 30d [--state succeeded,cancelled] [--dry-run]`: deletes finished
 * runs with their stages and events, in bounded batches, straight from the database (--url does
 * not apply). Bad arguments: exit 2, nothing deleted.
 */
export function registerPruneCommand(program: Command): void {
  program
    .command('prune')
    .description('delete finished runs older than --older-than, with their stages and events, in bounded batches (never an unfinished run)')
    .option('--older-than <age>', 'how long ago the runs finished, e.g. 30d, 12h (required)')
    .option('--state <states>', 'comma-separated finished states (default: succeeded,failed,cancelled,expired)')
    .option('--dry-run', 'count what would be deleted; delete nothing', false)
    .option('--batch-size <n>', 'runs per batch, one short statement each (default 500)')
    .action(async (_o: unknown, cmd: Command) => {
      const { pruneCommand } = await import('../prune/prune.js');
      await pruneCommand(cmd.optsWithGlobals<PruneArgs>());
    });
}
