import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';

interface ListOptions extends GlobalOptions {
  state?: string;
  workflow?: string;
  createdAfter?: string;
  createdBefore?: string;
  cursor?: string;
  limit: string;
}

/** `ratchet list`: runs, newest first, with filters and a cursor for the next page. */
export function registerListCommand(program: Command): void {
  program
    .command('list')
    .description('runs, newest first (filters: --state, --workflow, --created-after, --created-before; pages: --limit, --cursor)')
    .option('--state <states>', 'comma-separated run states, e.g. failed,cancelled; or awaiting_approval: the stages waiting for a person')
    .option('--workflow <name>', 'only this workflow')
    .option('--created-after <iso>', 'created at or after this ISO date-time')
    .option('--created-before <iso>', 'created before this ISO date-time')
    .option('--limit <n>', 'runs per page', '20')
    .option('--cursor <cursor>', 'the next page (printed after a full page)')
    .action(async (_o: unknown, cmd: Command) => {
      const [{ withBackend }, { formatRunList }, { printer }, { listQuerySchema }, { parseInput }] = await Promise.all([
        import('../api/backend.js'),
        import('../api/format.js'),
        import('../api/options.js'),
        import('../../api/schemas.js'),
        import('../../store/validate.js'),
      ]);
      const o = cmd.optsWithGlobals<ListOptions>();
      // A stage state, not a run's: the stages that wait for a person (issue 10), oldest first.
      if (o.state === 'awaiting_approval') {
        // It lists stages, oldest first, with a limit alone: a filter of runs would be silently ignored, so it is refused.
        const runFilters = [
          ['--workflow', o.workflow],
          ['--created-after', o.createdAfter],
          ['--created-before', o.createdBefore],
          ['--cursor', o.cursor],
        ].filter(([, v]) => v !== undefined);
        if (runFilters.length > 0) {
          const { InvalidInputError } = await import('../../errors.js');
          throw new InvalidInputError(
            `${runFilters.map(([f]) => f).join(', ')} does not apply with --state awaiting_approval (the stages that wait for a person, oldest first: --limit only)`,
            runFilters[0]![0]!.replace(/^--/, ''),
          );
        }
        const { intOption } = await import('../api/options.js');
        const limit = intOption(o.limit, '--limit', 1, 500);
        const page = await withBackend(o, (b) => b.approvals({ limit }));
        printer(o)(page, () =>
          page.approvals.length === 0
            ? 'nothing awaits approval'
            : page.approvals
                .map(
                  (a) =>
                    `${a.runId}  stage ${a.stageId} (${a.tool})  since ${a.since}${a.timeoutAt ? `  times out ${a.timeoutAt}` : ''}\n` +
                    `    input ${JSON.stringify(a.input)}\n    ratchet approve ${a.runId} --stage ${a.stageId}   |   ratchet reject ${a.runId} --stage ${a.stageId} --reason '...'`,
                )
                .join('\n'),
        );
        return;
      }
      const q = parseInput(
        listQuerySchema,
        {
          ...(o.state ? { state: o.state } : {}),
          ...(o.workflow ? { workflow: o.workflow } : {}),
          ...(o.createdAfter ? { createdAfter: o.createdAfter } : {}),
          ...(o.createdBefore ? { createdBefore: o.createdBefore } : {}),
          ...(o.cursor ? { cursor: o.cursor } : {}),
          limit: o.limit,
        },
        'list',
      );
      const page = await withBackend(o, (b) => b.list(q));
      printer(o)(page, () => formatRunList(page));
    });
}
