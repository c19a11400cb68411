import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';

/** `ratchet retry <id>`: a failed run goes on from its failed stages (fresh attempt budget). Exit 7 for a run that is not failed. */
export function registerRetryCommand(program: Command): void {
  program
    .command('retry')
    .description(
      'retry a failed run from its failed stages (exit 3 unknown id, 7 not failed: resubmit expired or cancelled runs with `run`)',
    )
    .argument('<id>', 'the run id')
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const [{ withBackend }, { printer }] = await Promise.all([import('../api/backend.js'), import('../api/options.js')]);
      const o = cmd.optsWithGlobals<GlobalOptions>();
      const res = await withBackend(o, (b) => b.retry(id));
      printer(o)(res, () => `run ${res.id} is ${res.state} again: ${res.note}`);
    });
}
