import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Command, Help } from 'commander';
import { describe, expect, it } from 'vitest';
import { COMMANDS, commandOnLine, registerCommands } from '../../src/cli/commands/index.js';

/**
 * `ratchet --help` imports no command module (src/cli/commands/index.ts): the table's help lines
 * must be what the modules declare, the command on the line must be found, and the help a person
 * sees must be the same whether the commands are stubs or real.
 */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

const program = () =>
  new Command('ratchet')
    .option('--database-url <url>')
    .option('--data-dir <dir>')
    .option('--json', '', false)
    .option('--url <url>')
    .option('--token <token>')
    .exitOverride();

function ratchet(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const env = { ...process.env, DATABASE_URL: 'postgres://root@127.0.0.1:1/never-opened', REDIS_URL: '' };
    const child = spawn(process.execPath, ['bin/ratchet.mjs', ...args], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    child.on('exit', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('lazy CLI commands', () => {
  it('the table matches every command module (name, help term, description), in order', async () => {
    const p = program();
    await registerCommands(p, [], true);
    const help = new Help();
    const real = p.commands.map((c) => ({ name: c.name(), term: help.subcommandTerm(c), description: c.description() }));
    const table = Object.entries(COMMANDS).map(([name, c]) => ({ name, term: c.term, description: c.description }));
    expect(table).toEqual(real);
  });

  it('finds the command on the line past the global options', () => {
    expect(commandOnLine([])).toBeNull();
    expect(commandOnLine(['--help'])).toBeNull();
    expect(commandOnLine(['--json', 'status', 'x'])).toBe('status');
    expect(commandOnLine(['--url', 'http://x', '--token', 't', 'list', '--limit', '2'])).toBe('list');
    expect(commandOnLine(['--database-url=postgres://x', 'run', 'wf'])).toBe('run');
    expect(commandOnLine(['--data-dir', 'status', 'events', 'r'])).toBe('events');
    expect(commandOnLine(['help', 'worker'])).toBe('worker');
    expect(commandOnLine(['stauts'])).toBeNull();
  });

  it('the top-level help with stubs is the help with every module loaded', async () => {
    const lazy = program();
    await registerCommands(lazy, ['--help']);
    const full = program();
    await registerCommands(full, [], true);
    expect(lazy.helpInformation()).toBe(full.helpInformation());
  });

  it('ratchet --help exits 0 with every command; a mistyped command is exit 2 with a suggestion', async () => {
    const help = await ratchet(['--help']);
    expect(help.code).toBe(0);
    for (const name of Object.keys(COMMANDS)) expect(help.stdout).toContain(`  ${name}`);
    const typo = await ratchet(['stauts', 'x']);
    expect(typo.code).toBe(2);
    expect(typo.stderr).toContain('status');
    const sub = await ratchet(['schedules', 'add', '--help']);
    expect(sub.code).toBe(0);
    expect(sub.stdout).toContain('create or replace a schedule');
  }, 60_000);
});
