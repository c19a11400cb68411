import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';

/** `ratchet cancel <id>`: cancel a run; a request a running stage already sent cannot be recalled (said so). Exit 7 when it already ended otherwise. */
export function registerCancelCommand(program: Command): void {
  program
    .command('cancel')
    .description('cancel a run (exit 3 unknown id, 7 when it already ended another way)')
    .argument('<id>', 'the run id')
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const [{ withBackend }, { printer }] = await Promise.all([import('../api/backend.js'), import('../api/options.js')]);
      const o = cmd.optsWithGlobals<GlobalOptions>();
      const res = await withBackend(o, (b) => b.cancel(id));
      printer(o)(
        res,
        () =>
          `run ${res.id} ${res.cancelled ? `cancelled (was ${res.previousState})` : 'was already cancelled'}: ${res.note}` +
          (res.runningStageIds.length > 0 ? `\n  stages in flight: ${res.runningStageIds.join(', ')}` : ''),
      );
    });
}
