import { z } from 'zod';
import type { Tool, ToolClass, Workflow } from './types.js';

/**
 * Brands put on what defineToolClass / defineTool make. `Symbol.for` keeps them recognisable
 * across module instances (the workflow loader imports files in their own tsx namespace, so
 * `src/definitions` and zod may be loaded twice in one process): a WeakSet would not be.
 */
const TOOL_CLASS_BRAND = Symbol.for('ratchet.definitions.tool_class');
const TOOL_BRAND = Symbol.for('ratchet.definitions.tool');

export function brandToolClass<T extends object>(value: T): T {
  Object.defineProperty(value, TOOL_CLASS_BRAND, { value: true });
  return value;
}

export function brandTool<T extends object>(value: T): T {
  Object.defineProperty(value, TOOL_BRAND, { value: true });
  return value;
}

/** A tool class made by defineToolClass. */
export function isToolClass(value: unknown): value is ToolClass {
  return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[TOOL_CLASS_BRAND] === true;
}

/** A tool made by defineTool. */
export function isTool(value: unknown): value is Tool {
  return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[TOOL_BRAND] === true;
}

/** A workflow (what defineWorkflow returns, or the loader's copy of it). */
export function isWorkflow(value: unknown): value is Workflow {
  const v = value as Partial<Workflow> | null;
  return typeof v === 'object' && v !== null && v.kind === 'workflow' && typeof v.name === 'string' && Array.isArray(v.steps);
}

/** A zod schema, from this copy of zod or another one (checked by shape, not instanceof). */
export function isZodSchema(value: unknown): value is z.ZodType {
  return (
    typeof value === 'object' && value !== null && '_zod' in value && typeof (value as { safeParse?: unknown }).safeParse === 'function'
  );
}

export const zodSchemaField = z.custom<z.ZodType>(isZodSchema, { message: 'must be a zod schema (z.object(...), z.string(), ...)' });

export const functionField = z.custom<(...args: never[]) => unknown>((v) => typeof v === 'function', { message: 'must be a function' });
