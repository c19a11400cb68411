import { PRIORITY_MAX, PRIORITY_MIN } from '../../definitions/priority.js';
import { InvalidInputError } from '../../errors.js';

/** --priority as submit options ({} when absent); bad values are a usage error before anything starts. */
export function priorityOption(raw: string | undefined): { priority?: number } {
  if (raw === undefined) return {};
  const n = Number(raw);
  if (!/^-?\d+$/.test(raw.trim()) || !Number.isInteger(n) || n < PRIORITY_MIN || n > PRIORITY_MAX) {
    throw new InvalidInputError(`--priority must be a whole number in ${PRIORITY_MIN}..${PRIORITY_MAX}`, 'priority');
  }
  return { priority: n };
}
