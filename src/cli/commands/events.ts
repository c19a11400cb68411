import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';

interface EventsOptions extends GlobalOptions {
  after?: string;
  limit: string;
}

/** `ratchet events <id>`: the run's durable history, oldest first. */
export function registerEventsCommand(program: Command): void {
  program
    .command('events')
    .description("a run's events, oldest first (exit 3 for an unknown id)")
    .argument('<id>', 'the run id')
    .option('--after <eventId>', 'only events after this event id')
    .option('--limit <n>', 'events per page', '500')
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const [{ withBackend }, { formatEvents }, { printer }, { eventsQuerySchema }, { parseInput }] = await Promise.all([
        import('../api/backend.js'),
        import('../api/format.js'),
        import('../api/options.js'),
        import('../../api/schemas.js'),
        import('../../store/validate.js'),
      ]);
      const o = cmd.optsWithGlobals<EventsOptions>();
      const q = parseInput(eventsQuerySchema, { ...(o.after ? { after: o.after } : {}), limit: o.limit }, 'events');
      const page = await withBackend(o, (b) => b.events(id, q));
      printer(o)(page, () => formatEvents(page));
    });
}
