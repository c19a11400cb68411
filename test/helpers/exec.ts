import { spawn } from 'node:child_process';

export interface ExecResult {
  code: number | null;
  stdout: string;
  stderr: string;
  /** The JSON lines of stdout. */
  json: Record<string, unknown>[];
}

/** Variables a user's shell would not have here: the child gets the embedded default unless a test says otherwise. */
const CLEARED = [
  'DATABASE_URL',
  'REDIS_URL',
  'RATCHET_DATA_DIR',
  'RATCHET_URL',
  'RATCHET_TOKEN',
  'RATCHET_WORKFLOWS_DIR',
  'RATCHET_RETENTION',
  'NODE_OPTIONS',
];

/** Runs a command to its end as a child process (bounded by `timeoutMs`) and collects what it printed. */
export function exec(
  file: string,
  args: string[],
  opts: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number },
): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const env = { ...process.env };
    for (const name of CLEARED) delete env[name];
    const child = spawn(file, args, { cwd: opts.cwd, env: { ...env, ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    const timeoutMs = opts.timeoutMs ?? 120_000;
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${file} ${args.join(' ')} did not end within ${timeoutMs} ms; stderr: ${stderr}`));
    }, timeoutMs);
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      const json = stdout
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      resolve({ code, stdout, stderr, json });
    });
  });
}
