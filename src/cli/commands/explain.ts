import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';

/** `ratchet explain <id>`: why a run is where it is — one verdict and its evidence. */
export function registerExplainCommand(program: Command): void {
  program
    .command('explain')
    .description('why a run is where it is: running and healthy, queued and why, stuck, or finished (exit 3 for an unknown id)')
    .argument('<id>', 'the run id')
    .option('--workflows-dir <dir>', 'workflow files, for class limits when reading the store directly (env RATCHET_WORKFLOWS_DIR)')
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const [{ withBackend }, { formatExplanation }, { printer }] = await Promise.all([
        import('../api/backend.js'),
        import('../api/format.js'),
        import('../api/options.js'),
      ]);
      const o = cmd.optsWithGlobals<GlobalOptions & { workflowsDir?: string }>();
      const x = await withBackend(o, (b) => b.explain(id), { workflows: true });
      printer(o)(x, () => formatExplanation(x));
    });
}
