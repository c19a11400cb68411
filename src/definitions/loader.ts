import { readdir, stat } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { register } from 'tsx/esm/api';
import { InvalidDefinitionError, InvalidInputError } from '../errors.js';
import { isWorkflow } from './guards.js';
import type { Workflow } from './types.js';
import { isSchedule, withSourceFile, type Schedule } from '../schedules/define.js';

const SOURCE = /\.(ts|mts|js|mjs)$/;
const SKIP = /\.d\.m?ts$|\.test\./;

/** A workflow file that could not be imported (syntax error, a definition refused at import, ...). */
export class WorkflowLoadError extends InvalidDefinitionError {
  constructor(
    readonly file: string,
    cause: unknown,
  ) {
    const message = cause instanceof Error ? cause.message : String(cause);
    const causeCode = (cause as { code?: unknown } | null)?.code;
    super(`cannot load workflow file ${file}: ${message}`, file, {
      file,
      cause: { name: (cause as Error | null)?.name, message, ...(typeof causeCode === 'string' ? { code: causeCode } : {}) },
    });
    Object.defineProperty(this, 'cause', { value: cause, enumerable: false, writable: true, configurable: true });
  }
}

/** Source files under `dir`, sorted; skips `*.d.ts`, `*.test.*`, `node_modules` and names starting with `_` or `.`. */
async function sourceFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    if (entry.name.startsWith('_') || entry.name.startsWith('.') || entry.name === 'node_modules') continue;
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...(await sourceFiles(path)));
    else if (entry.isFile() && SOURCE.test(entry.name) && !SKIP.test(entry.name)) out.push(path);
  }
  return out.sort();
}

async function requireFolder(dir: string): Promise<void> {
  const info = await stat(dir).catch(() => null);
  if (!info) throw new InvalidInputError(`the workflows folder ${dir} does not exist`, 'workflowsDir', { dir, reason: 'missing_folder' });
  if (!info.isDirectory()) throw new InvalidInputError(`${dir} is not a folder`, 'workflowsDir', { dir, reason: 'not_a_folder' });
}

let typeScriptHooks = false;

/** tsx's loader hooks, registered once per process (a second registration by the host is harmless). */
function enableTypeScript(): void {
  if (typeScriptHooks) return;
  register();
  typeScriptHooks = true;
}

/**
 * Imports every workflow file under `dir` (TypeScript through tsx's hooks on Node 20) and
 * returns its workflows (default and named exports), each a frozen copy with `sourceFile` set.
 * Several versions of one workflow may sit side by side (`version: 2` in `summarise.ts`,
 * `version: 1` kept in `summarise.v1.ts`, or both exported from one file); one name and
 * version declared twice is refused.
 *
 * The files join the host's module graph (global `register()` + `import()`), not a tsx
 * namespace: `tsImport` gives every call its own namespace, so a tools module imported by two
 * workflow files became two sets of tool objects, and `PermanentError` in a tool became another
 * class than the worker's. One graph keeps one copy of Ratchet, zod and the tools per process;
 * the price is that a file is evaluated once per process (no reload).
 */
export async function loadWorkflows(dir: string): Promise<Workflow[]> {
  return (await loadDefinitions(dir)).workflows;
}

/** The workflows of loadWorkflows, and the schedules (defineSchedule) exported beside them. */
export async function loadDefinitions(dir: string): Promise<{ workflows: Workflow[]; schedules: Schedule[] }> {
  const root = resolve(dir);
  await requireFolder(root);
  const files = await sourceFiles(root);
  if (files.length === 0) return { workflows: [], schedules: [] };
  enableTypeScript();
  const schedules = new Map<Schedule, Schedule>();
  const seen = new Set<Workflow>();
  const byVersion = new Map<string, Workflow>();
  for (const file of files) {
    let exports: Record<string, unknown>;
    try {
      exports = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
    } catch (err) {
      throw new WorkflowLoadError(file, err);
    }
    for (const value of Object.values(exports)) {
      if (isSchedule(value) && !schedules.has(value)) schedules.set(value, withSourceFile(value, file));
      if (!isWorkflow(value) || seen.has(value)) continue;
      seen.add(value);
      const version = value.version ?? 1; // a workflow made by an older copy of Ratchet has none
      const id = `${value.name}@${version}`;
      const earlier = byVersion.get(id);
      if (earlier) {
        const what = version === 1 ? `workflow name "${value.name}"` : `version ${version} of workflow "${value.name}"`;
        throw new InvalidDefinitionError(`${what} is declared twice: in ${earlier.sourceFile} and in ${file}`, file, {
          workflow: value.name,
          version,
          files: [earlier.sourceFile, file],
        });
      }
      byVersion.set(id, Object.freeze({ ...value, version, sourceFile: file }));
    }
  }
  return { workflows: [...byVersion.values()], schedules: [...schedules.values()] };
}
