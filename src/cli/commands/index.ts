import { type Command, Help } from 'commander';

/**
 * The CLI's commands, loaded lazily: `ratchet --help` (or a usage error) must not load zod, the
 * engine or any command's module. main.ts imports only the module of the command on the command
 * line; every other command is a stub carrying its help line (term + description) from this table.
 * test/cli/lazy-commands.test.ts registers every module for real and checks this table against it,
 * so the help text cannot drift.
 */
export interface LazyCommand {
  /** What `ratchet --help` shows on the left: name, `[options]` when it has any, its arguments. */
  term: string;
  description: string;
  load: () => Promise<(program: Command) => void>;
}

export const COMMANDS: Record<string, LazyCommand> = {
  init: {
    term: 'init [dir]',
    description: 'create a starter workflow (workflows/hello.ts) and a tsconfig.json if none exists; never overwrites (exit 2)',
    load: async () => (await import('./init.js')).registerInitCommand,
  },
  migrate: {
    term: 'migrate',
    description: 'apply the database migrations (under an advisory lock) and exit',
    load: async () => (await import('./migrate.js')).registerMigrateCommand,
  },
  run: {
    term: 'run [options] <workflow>',
    description: 'run a workflow to its end in this process (an in-process worker), showing each stage as it advances',
    load: async () => (await import('./run.js')).registerRunCommand,
  },
  worker: {
    term: 'worker [options]',
    description: 'run a worker process: claim and execute stages of the given tool classes',
    load: async () => (await import('./worker.js')).registerWorkerCommand,
  },
  serve: {
    term: 'serve [options]',
    description: 'serve the task API (HTTP): submit, status, list, events, explain, cancel, retry',
    load: async () => (await import('./serve.js')).registerServeCommand,
  },
  dev: {
    term: 'dev [options]',
    description: 'embedded database, a worker and the task API in one process',
    load: async () => (await import('./dev.js')).registerDevCommand,
  },
  status: {
    term: 'status <id>',
    description: "a run's state, stages, result or error (exit 3 for an unknown id)",
    load: async () => (await import('./status.js')).registerStatusCommand,
  },
  list: {
    term: 'list [options]',
    description: 'runs, newest first (filters: --state, --workflow, --created-after, --created-before; pages: --limit, --cursor)',
    load: async () => (await import('./list.js')).registerListCommand,
  },
  events: {
    term: 'events [options] <id>',
    description: "a run's events, oldest first (exit 3 for an unknown id)",
    load: async () => (await import('./events.js')).registerEventsCommand,
  },
  watch: {
    term: 'watch [options] <id>',
    description: "follow a run's events live until it ends (exit 0 succeeded, 5 failed / cancelled / expired, 6 --timeout)",
    load: async () => (await import('./watch.js')).registerWatchCommand,
  },
  explain: {
    term: 'explain [options] <id>',
    description: 'why a run is where it is: running and healthy, queued and why, stuck, or finished (exit 3 for an unknown id)',
    load: async () => (await import('./explain.js')).registerExplainCommand,
  },
  cancel: {
    term: 'cancel <id>',
    description: 'cancel a run (exit 3 unknown id, 7 when it already ended another way)',
    load: async () => (await import('./cancel.js')).registerCancelCommand,
  },
  retry: {
    term: 'retry <id>',
    description:
      'retry a failed run from its failed stages (exit 3 unknown id, 7 not failed: resubmit expired or cancelled runs with `run`)',
    load: async () => (await import('./retry.js')).registerRetryCommand,
  },
  prune: {
    term: 'prune [options]',
    description: 'delete finished runs older than --older-than, with their stages and events, in bounded batches (never an unfinished run)',
    load: async () => (await import('./prune.js')).registerPruneCommand,
  },
  schedules: {
    term: 'schedules',
    description: 'cron schedules: list them (add / delete below); ticks fire in workers',
    load: async () => (await import('./schedules.js')).registerSchedulesCommand,
  },
  // Waits (issue 10). The descriptions are WAIT_COMMAND_HELP's in ./waits.ts (test/cli/lazy-commands.test.ts compares them).
  signal: {
    term: 'signal [options] <run> <name>',
    description: "send a signal to a run's waitForSignal step (kept until the wait starts when it has not yet)",
    load: async () => (await import('./waits.js')).registerSignalCommand,
  },
  approve: {
    term: 'approve [options] <run>',
    description: 'approve a tool call that waits for a person (it is queued and runs); --input edits its input',
    load: async () => (await import('./waits.js')).registerApproveCommand,
  },
  reject: {
    term: 'reject [options] <run>',
    description: "reject a tool call that waits for a person (an agent hears the reason as the tool's answer; a static run fails)",
    load: async () => (await import('./waits.js')).registerRejectCommand,
  },
};

/** The program's options that take a value (so the word after them is not the command). */
const VALUED = new Set(['--database-url', '--data-dir', '--url', '--token']);

/**
 * The command named on the command line (`ratchet [global options] <command> ...`, or
 * `ratchet help <command>`), or null when there is none (`ratchet`, `ratchet --help`) or the
 * word is not a command (commander then reports it, with its suggestion).
 */
export function commandOnLine(args: readonly string[]): string | null {
  let first: string | null = null;
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    if (a === '--') break;
    if (a.startsWith('-')) {
      if (VALUED.has(a)) i++;
      continue;
    }
    if (first === null && a === 'help') {
      first = a;
      continue;
    }
    return Object.hasOwn(COMMANDS, a) ? a : null;
  }
  return null;
}

/**
 * Registers the command on the line for real (importing its module only) and every other one as
 * a stub with its help line. `all` registers every module (tests, and the fallback when in doubt).
 */
export async function registerCommands(program: Command, args: readonly string[], all = false): Promise<void> {
  const wanted = all ? null : commandOnLine(args);
  const terms = new Map<Command, string>();
  for (const [name, c] of Object.entries(COMMANDS)) {
    if (all || name === wanted) (await c.load())(program);
    else terms.set(program.command(name).description(c.description), c.term);
  }
  if (terms.size > 0) {
    const plain = new Help();
    program.configureHelp({ subcommandTerm: (cmd) => terms.get(cmd) ?? plain.subcommandTerm(cmd) });
  }
}
