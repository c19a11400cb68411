import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';

/** `ratchet status <id>`: the run's state, its stages (attempt, lease, heartbeat, last error), its result or error. Unknown id: exit 3. */
export function registerStatusCommand(program: Command): void {
  program
    .command('status')
    .description("a run's state, stages, result or error (exit 3 for an unknown id)")
    .argument('<id>', 'the run id')
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const [{ withBackend }, { formatRun }, { printer }] = await Promise.all([
        import('../api/backend.js'),
        import('../api/format.js'),
        import('../api/options.js'),
      ]);
      const o = cmd.optsWithGlobals<GlobalOptions>();
      const run = await withBackend(o, (b) => b.get(id));
      printer(o)(run, () => formatRun(run));
    });
}
