import { z } from 'zod';
import { InvalidInputError } from '../errors.js';

/** PostgreSQL bigint's upper bound (event ids, stage ids, fences). */
export const PG_BIGINT_MAX = 2n ** 63n - 1n;

/** The longest delay a timer honours (2^31 - 1 ms): a retry delay, a rate window, a child run's own deadline. */
export const TIMER_MS_MAX = 2 ** 31 - 1;
/** A delay in whole ms, 0 up to TIMER_MS_MAX. */
export const delayMsSchema = z.number().int().min(0).max(TIMER_MS_MAX);

/** Parses with zod; a failure becomes InvalidInputError naming the first offending JSON path. */
export function parseInput<S extends z.ZodType>(schema: S, value: unknown, where: string): z.output<S> {
  const res = schema.safeParse(value);
  if (res.success) return res.data;
  const issue = res.error.issues[0];
  const path = [where, ...(issue?.path ?? []).map((p) => (typeof p === 'number' ? `[${p}]` : `.${String(p)}`))]
    .join('')
    .replace(/\.\[/g, '[');
  throw new InvalidInputError(issue?.message ?? 'invalid input', path, {
    issues: res.error.issues.map((i) => ({ path: i.path.map(String), message: i.message })),
  });
}
