import type { Command } from 'commander';

/** The listening options `serve` and `dev` share (flags over environment over defaults). */
export function withServeOptions(cmd: Command): Command {
  return cmd
    .option('--host <host>', 'address to listen on (env RATCHET_HOST)', undefined)
    .option('--port <port>', 'port (env RATCHET_PORT; 0 picks a free one)', undefined)
    .option('--body-limit <bytes>', 'largest request body (env RATCHET_BODY_LIMIT)', undefined)
    .option('--workflows-dir <dir>', 'workflow files (env RATCHET_WORKFLOWS_DIR)', undefined);
}
