import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';

interface WaitCliOptions extends GlobalOptions {
  workflowsDir?: string;
}

/**
 * Waits (issue 10): `ratchet signal <run> <name> --data <json|@file>`, `ratchet approve <run>`,
 * `ratchet reject <run>`. Through a server (--url) or the store directly (the run's workflow
 * definitions are loaded from --workflows-dir to check the payload and the edited input).
 * Exit codes: 2 bad input (nothing written), 3 unknown run / stage / signal name, 7 the run's
 * state does not allow it (ended, already decided, no stage awaits approval).
 */
export function registerWaitCommands(program: Command): void {
  registerSignalCommand(program);
  registerApproveCommand(program);
  registerRejectCommand(program);
}

/** The description each command shows in `ratchet --help` (src/cli/commands/index.ts shows the same before loading this module). */
export const WAIT_COMMAND_HELP = {
  signal: "send a signal to a run's waitForSignal step (kept until the wait starts when it has not yet)",
  approve: 'approve a tool call that waits for a person (it is queued and runs); --input edits its input',
  reject: "reject a tool call that waits for a person (an agent hears the reason as the tool's answer; a static run fails)",
} as const;

export function registerSignalCommand(program: Command): void {
  program
    .command('signal')
    .description(WAIT_COMMAND_HELP.signal)
    .argument('<run>', 'the run id')
    .argument('<name>', 'the signal name')
    .requiredOption('--data <json>', 'the payload: inline JSON, or @path to a JSON file (@- reads stdin)')
    .option('--signal-id <id>', 'idempotency: the same id is delivered once (default: a new one)')
    .option('--workflows-dir <dir>', 'workflow definitions, without --url (env RATCHET_WORKFLOWS_DIR)')
    .action(async (runId: string, name: string, _o: unknown, cmd: Command) => {
      const [{ withBackend }, { printer }, { readJsonArg }] = await Promise.all([
        import('../api/backend.js'),
        import('../api/options.js'),
        import('../run/input.js'),
      ]);
      const o = cmd.optsWithGlobals<WaitCliOptions & { data: string; signalId?: string }>();
      const payload = await readJsonArg(o.data, '--data', 'payload');
      const res = await withBackend(o, (b) => b.signal(runId, name, payload, o.signalId), { workflows: true });
      printer(o)(
        res,
        () =>
          `${res.duplicate ? 'already sent: ' : ''}signal ${res.name} (${res.signalId}) ` +
          (res.status === 'delivered' ? `delivered to stage ${res.stageId}` : 'kept: the run has not reached its wait yet'),
      );
    });
}

const decide = (program: Command, verb: 'approve' | 'reject') =>
  program
    .command(verb)
    .description(WAIT_COMMAND_HELP[verb])
    .argument('<run>', 'the run id')
    .option('--stage <id>', "the stage (default: the run's one stage awaiting approval)")
    .option('--reason <text>', 'why (recorded in the events)')
    .option('--by <name>', 'who you are (recorded beside the token)')
    .option('--workflows-dir <dir>', 'workflow definitions, without --url (env RATCHET_WORKFLOWS_DIR)');
export function registerApproveCommand(program: Command): void {
  decide(program, 'approve')
    .option('--input <json>', "an edited input: inline JSON or @path, checked by the tool's schema")
    .action(async (runId: string, _o: unknown, cmd: Command) => {
      const [{ withBackend }, { printer }, { readJsonArg }, { stageIdOption }] = await Promise.all([
        import('../api/backend.js'),
        import('../api/options.js'),
        import('../run/input.js'),
        import('../api/wait-options.js'),
      ]);
      const o = cmd.optsWithGlobals<WaitCliOptions & { stage?: string; input?: string; reason?: string; by?: string }>();
      const args = {
        ...stageIdOption(o.stage),
        ...(o.input !== undefined ? { input: await readJsonArg(o.input, '--input', 'input') } : {}),
        ...(o.reason !== undefined ? { reason: o.reason } : {}),
        ...(o.by !== undefined ? { by: o.by } : {}),
      };
      const res = await withBackend(o, (b) => b.approve(runId, args), { workflows: true });
      printer(o)(
        res,
        () =>
          `stage ${res.stageId} of run ${res.runId} approved by ${res.decidedBy}${res.inputHash ? ' with an edited input' : ''}: queued`,
      );
    });
}

export function registerRejectCommand(program: Command): void {
  decide(program, 'reject').action(async (runId: string, _o: unknown, cmd: Command) => {
    const [{ withBackend }, { printer }, { stageIdOption }] = await Promise.all([
      import('../api/backend.js'),
      import('../api/options.js'),
      import('../api/wait-options.js'),
    ]);
    const o = cmd.optsWithGlobals<WaitCliOptions & { stage?: string; reason?: string; by?: string }>();
    const args = {
      ...stageIdOption(o.stage),
      ...(o.reason !== undefined ? { reason: o.reason } : {}),
      ...(o.by !== undefined ? { by: o.by } : {}),
    };
    const res = await withBackend(o, (b) => b.reject(runId, args), { workflows: true });
    printer(o)(
      res,
      () => `stage ${res.stageId} of run ${res.runId} rejected by ${res.decidedBy}${res.runEnded ? `: the run ${res.runEnded}` : ''}`,
    );
  });
}
