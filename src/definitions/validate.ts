import type { z } from 'zod';
import { InvalidDefinitionError } from '../errors.js';

/** `where` + a zod issue path, as `toolClass[io].retry.backoff.max` or `workflow[x].steps[1].name`. */
export function joinPath(where: string, path: readonly PropertyKey[]): string {
  let out = where;
  for (const key of path) out += typeof key === 'number' ? `[${key}]` : `.${String(key)}`;
  return out;
}

/**
 * Parses definition options with their zod schema; every problem found is named in one
 * InvalidDefinitionError (message and `details.issues`), located at the first one.
 */
export function parseDefinition<S extends z.ZodType>(schema: S, value: unknown, where: string): z.output<S> {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const issues = result.error.issues.map((issue) => ({ path: joinPath(where, issue.path), message: issue.message }));
  const first = issues[0] ?? { path: where, message: 'invalid definition' };
  const message =
    issues.length === 1 ? first.message : `${issues.length} problems: ${issues.map((i) => `${i.path}: ${i.message}`).join('; ')}`;
  throw new InvalidDefinitionError(message, first.path, { issues });
}

/** Names a definition in error paths: `toolClass[io]`, or just `toolClass` when the name is unusable. */
export function definitionPath(kind: string, name: unknown): string {
  return typeof name === 'string' && name.length > 0 && name.length <= 64 ? `${kind}[${name}]` : kind;
}
