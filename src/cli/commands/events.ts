import type { Command } from 'commander';
import { withBackend } from '../api/backend.js';
import { formatEvents } from '../api/format.js';
import { printer, type GlobalOptions } from '../api/options.js';
import { eventsQuerySchema } from '../../api/schemas.js';
import { parseInput } from '../../store/validate.js';

interface EventsOptions extends GlobalOptions { after?: string; limit: string }

/** `ratchet events <id>`: the run's durable history, oldest first. */
export function registerEventsCommand(program: Command): void {
  program.command('events')
    .description("a run's events, oldest first (exit 3 for an unknown id)")
    .argument('<id>', 'the run id')
    .option('--after <eventId>', 'only events after this event id')
    .option('--limit <n>', 'events per page', '500')
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const o = cmd.optsWithGlobals<EventsOptions>();
      const q = parseInput(eventsQuerySchema, { ...(o.after ? { after: o.after } : {}), limit: o.limit }, 'events');
      const page = await withBackend(o, (b) => b.events(id, q));
      printer(o)(page, () => formatEvents(page));
    });
}
