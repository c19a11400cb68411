import { z } from 'zod';
import { InvalidDefinitionError } from '../errors.js';
import type { Tool } from './types.js';

type JsonSchema = Record<string, unknown>;

/** Zod types whose values do not come back the same from JSON (stored results must). */
const NOT_JSON = new Set(['date', 'bigint', 'map', 'set', 'symbol', 'function', 'undefined', 'void', 'nan', 'promise', 'file']);

function zodType(schema: unknown): string {
  return (schema as { _zod?: { def?: { type?: string } } })._zod?.def?.type ?? 'unknown';
}

/**
 * The JSON Schema of a tool's input, as the model is shown it (`parameters` of a function
 * tool): zod's draft 2020-12 output for the input side, without the `$schema` line.
 * A schema that JSON Schema cannot express is an InvalidDefinitionError naming the tool.
 */
export function toolJsonSchema(tool: Pick<Tool, 'name' | 'input'>): JsonSchema {
  try {
    const { $schema: _ignored, ...schema } = z.toJSONSchema(tool.input, { io: 'input' }) as JsonSchema;
    return schema;
  } catch (err) {
    throw new InvalidDefinitionError(
      `the input of tool "${tool.name}" cannot be shown to a model as JSON Schema: ${(err as Error).message}`,
      `tool[${tool.name}].input`,
    );
  }
}

/**
 * A stable structural description of a schema, for definition hashes: its JSON Schema, where
 * each part JSON Schema cannot express is described by its zod type instead of throwing.
 */
export function schemaFingerprint(schema: z.ZodType, io: 'input' | 'output'): unknown {
  try {
    return z.toJSONSchema(schema, { io, unrepresentable: (ctx) => ({ 'x-zod-type': zodType(ctx.zodSchema) }) });
  } catch {
    return { 'x-zod-unconvertible': zodType(schema) };
  }
}

/** Parts of an output schema whose values do not survive JSON (a Date, a BigInt, a Map...). */
export function nonJsonParts(schema: z.ZodType): { path: string; type: string }[] {
  const found: { path: string; type: string }[] = [];
  try {
    z.toJSONSchema(schema, {
      io: 'output',
      unrepresentable: (ctx) => {
        const type = zodType(ctx.zodSchema);
        if (NOT_JSON.has(type)) found.push({ path: ctx.path.join('.') || '(root)', type });
        return 'any';
      },
    });
  } catch {
    // A schema zod cannot walk at all is judged at run time, by its values.
  }
  return found;
}
