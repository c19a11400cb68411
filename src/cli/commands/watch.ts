import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';

interface WatchOptions extends GlobalOptions {
  timeout: string;
  after?: string;
  stages: boolean;
  tokens: boolean;
  workflowsDir?: string;
}

/**
 * `ratchet watch <id>`: a run's events as they are committed, until its terminal event — from a
 * server's live stream (--url: client.watch, which reconnects and falls back to polling) or
 * from the database directly (LISTEN/NOTIFY; polling on embedded PGlite). One line per event
 * (--stages: one per stage change; --tokens: a streaming model's pieces as they arrive); --json
 * prints each event as the API's JSON (and `{"type":"token",...}` lines with --tokens), then a
 * `watch_end` line. Exit 0 when the run succeeded, 5 failed / cancelled / expired, 6 --timeout
 * passed first (the run goes on), 3 unknown run, 130 interrupted.
 */
export function registerWatchCommand(program: Command): void {
  program
    .command('watch')
    .description("follow a run's events live until it ends (exit 0 succeeded, 5 failed / cancelled / expired, 6 --timeout)")
    .argument('<id>', 'the run id')
    .option('--timeout <duration>', 'stop watching after this long (the run goes on)', '10m')
    .option('--after <eventId>', 'only events after this event id')
    .option('--stages', 'one line per stage change instead of one per event', false)
    .option('--tokens', "print a streaming model's answer as it arrives (--json: token lines; never stored, not replayed)", false)
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const { watchCommand } = await import('../run/watch-command.js');
      await watchCommand(id, cmd.optsWithGlobals<WatchOptions>());
    });
}
