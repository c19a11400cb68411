import pino, { type Logger } from 'pino';

/**
 * The default logger: pino JSON on stderr, level from RATCHET_LOG_LEVEL (default `info`).
 * Logs carry ids, tokens, hashes, classes, durations and error codes — never prompts,
 * inputs or results.
 */
export function defaultLogger(): Logger {
  return pino({ name: 'ratchet', level: process.env.RATCHET_LOG_LEVEL ?? 'info' }, pino.destination(2));
}

export const silentLogger = (): Logger => pino({ level: 'silent' });
