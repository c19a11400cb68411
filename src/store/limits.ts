/**
 * The limits on what callers hand Ratchet, in one place. Each bounds something that would
 * otherwise fail deep inside (a stack overflow, PostgreSQL refusing a value) as an untyped
 * error; past one, the caller gets an InvalidInputError naming the value, and nothing is written.
 */

/**
 * How deep a JSON value (a run's input, a tool's output, a receiver's response body) may
 * nest: arrays and objects inside each other. 128 is serde_json's default; real documents stay
 * far below it, and checking it is what keeps a 100,000-deep value from overflowing the stack
 * (ours, zod's, or PostgreSQL's jsonb parser).
 */
export const MAX_JSON_DEPTH = 128;

/**
 * The largest JSON value, serialised (UTF-8 bytes), stored in one jsonb column. PostgreSQL's
 * own ceiling is 255 MiB per jsonb value, and a run's input is written twice (the run and its
 * first stage); 16 MiB leaves room and still holds any sane document. The task API's body
 * limit (1 MiB by default) usually refuses first.
 */
export const MAX_JSON_BYTES = 16 * 1024 * 1024;

/**
 * Timestamps a caller may give (a deadline, a createdAfter / createdBefore filter, a cursor):
 * RFC 3339's four-digit years, without year 0, which PostgreSQL does not have.
 */
export const MIN_TIMESTAMP_MS = new Date('0001-01-01T00:00:00.000Z').getTime();
export const MAX_TIMESTAMP_MS = new Date('9999-12-31T23:59:59.999Z').getTime();

/** Is `d` a valid Date inside [MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS]? */
export function isStorableTime(d: Date): boolean {
  const t = d.getTime();
  return Number.isFinite(t) && t >= MIN_TIMESTAMP_MS && t <= MAX_TIMESTAMP_MS;
}

export const STORABLE_TIME_RANGE = 'between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z';
