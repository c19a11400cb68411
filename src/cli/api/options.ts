import pino, { type Logger } from 'pino';
import { InvalidInputError } from '../../errors.js';

/**
 * Where the CLI's run commands find runs, flags over environment over defaults:
 *   --url (RATCHET_URL) + --token (RATCHET_TOKEN): a task API server, through ratchet/client;
 *   else the store directly: --database-url (DATABASE_URL), or the embedded --data-dir
 *   (RATCHET_DATA_DIR, default .ratchet/).
 * An empty variable counts as unset.
 */
export interface GlobalOptions {
  url?: string;
  token?: string;
  databaseUrl?: string;
  dataDir?: string;
  json: boolean;
}

const pick = (...values: (string | undefined)[]): string | undefined => values.find((v) => v !== undefined && v !== '');

export function serverUrl(o: GlobalOptions): string | undefined {
  return pick(o.url, process.env.RATCHET_URL);
}

export function bearerToken(o: GlobalOptions): string | undefined {
  return pick(o.token, process.env.RATCHET_TOKEN);
}

export function storeTarget(o: GlobalOptions): { databaseUrl?: string; dataDir?: string } {
  return { databaseUrl: pick(o.databaseUrl, process.env.DATABASE_URL), dataDir: pick(o.dataDir, process.env.RATCHET_DATA_DIR) };
}

export function workflowsDir(flag: string | undefined): string {
  return pick(flag, process.env.RATCHET_WORKFLOWS_DIR) ?? 'workflows';
}

export function intOption(value: string, flag: string, min: number, max: number): number {
  const n = Number(value);
  if (!/^\d+$/.test(value.trim()) || !Number.isInteger(n) || n < min || n > max) {
    throw new InvalidInputError(`${flag} must be a whole number in ${min}..${max}`, flag.replace(/^--/, ''));
  }
  return n;
}

/** Logs go to stderr, errors only unless RATCHET_LOG_LEVEL says otherwise (stdout is the command's answer). */
export function cliLogger(defaultLevel = 'error'): Logger {
  return pino({ name: 'ratchet', level: process.env.RATCHET_LOG_LEVEL ?? defaultLevel }, pino.destination(2));
}

/** Writes the answer: JSON (one line) with --json, else the text. */
export function printer(o: Pick<GlobalOptions, 'json'>): (json: unknown, text: () => string) => void {
  return (json, text) => process.stdout.write(o.json ? `${JSON.stringify(json)}\n` : `${text()}\n`);
}
