import { existsSync, statSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { join, relative, resolve } from 'node:path';
import { InvalidInputError } from '../../errors.js';
import { STARTER_INPUT, STARTER_TSCONFIG, STARTER_WORKFLOW, STARTER_WORKFLOW_FILE, STARTER_WORKFLOWS_PACKAGE } from './starter.js';

export interface InitResult {
  dir: string;
  /** Files written, relative to `dir`. */
  created: string[];
  /** Optional files left as they were because they exist. */
  kept: string[];
  /** The commands to type next. */
  next: string[];
}

/** A file init writes: `required` ones refuse the whole init when they exist; the others are kept as they are. */
export interface Planned {
  path: string;
  text: string;
  required: boolean;
}

export const PLAN: readonly Planned[] = [
  { path: join('workflows', `${STARTER_WORKFLOW}.ts`), text: STARTER_WORKFLOW_FILE, required: true },
  { path: join('workflows', 'package.json'), text: STARTER_WORKFLOWS_PACKAGE, required: false },
  { path: 'tsconfig.json', text: STARTER_TSCONFIG, required: false },
];

/** Whether `name` resolves from `dir` the way the workflow file will import it. */
function resolvable(dir: string, name: string): boolean {
  try {
    createRequire(join(dir, 'workflows', 'noop.js')).resolve(`${name}/package.json`);
    return true;
  } catch {
    return false;
  }
}

const quote = (s: string) => (/^[\w./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);

/**
 * Writes the starter into `dir`. Everything is checked before anything is written: when the
 * starter workflow exists already (or `dir` is not a folder), nothing changes and the answer is
 * an InvalidInputError (exit 2). Files are created with the exclusive flag, so a file that
 * appears meanwhile is not overwritten either.
 */
export async function initProject(dirArg: string): Promise<InitResult> {
  const dir = resolve(dirArg);
  if (existsSync(dir) && !statSync(dir).isDirectory()) {
    throw new InvalidInputError(`${dirArg} exists and is not a folder`, 'dir', { reason: 'not_a_folder', dir });
  }
  const exists = PLAN.filter((f) => existsSync(join(dir, f.path)));
  const blocking = exists.filter((f) => f.required);
  if (blocking.length > 0) {
    if (blocking.length === 1) throw fileExists(dirArg, blocking[0]!.path);
    const files = blocking.map((f) => join(dirArg, f.path)).join(', ');
    throw new InvalidInputError(
      `${files} already exist: ratchet init never overwrites a file (remove them, or init another folder)`,
      'dir',
      { reason: 'file_exists', files: blocking.map((f) => f.path) },
    );
  }
  const { created, kept } = await writeStarterFiles(
    dir,
    dirArg,
    PLAN.filter((f) => !exists.includes(f)),
  );
  const cd = relative(process.cwd(), dir);
  const missing = ['ratchet', 'zod'].filter((name) => !resolvable(dir, name));
  const next = [
    ...(cd ? [`cd ${quote(cd)}`] : []),
    ...(missing.length > 0 ? [`npm install ${missing.join(' ')}`] : []),
    `npx ratchet run ${STARTER_WORKFLOW} --input ${quote(STARTER_INPUT)}`,
  ];
  return { dir, created, kept: [...exists.map((f) => f.path), ...kept], next };
}

const fileExists = (dirArg: string, path: string) =>
  new InvalidInputError(
    `${join(dirArg, path)} already exists: ratchet init never overwrites a file (remove it, or init another folder)`,
    'dir',
    { reason: 'file_exists', files: [path] },
  );

/**
 * Writes the files with the exclusive flag (O_EXCL): one that appeared since the check (another
 * init, an editor) is never overwritten. An optional one is then kept; a required one (the
 * starter workflow, written first, so nothing else is written yet) is the same typed error as the
 * check's: InvalidInputError, reason 'file_exists' (exit 2), never a bare EEXIST.
 */
export async function writeStarterFiles(
  dir: string,
  dirArg: string,
  files: readonly Planned[],
): Promise<{ created: string[]; kept: string[] }> {
  const created: string[] = [];
  const kept: string[] = [];
  for (const f of files) {
    await mkdir(join(dir, f.path, '..'), { recursive: true });
    try {
      await writeFile(join(dir, f.path), f.text, { flag: 'wx' });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      if (f.required) throw fileExists(dirArg, f.path);
      kept.push(f.path);
      continue;
    }
    created.push(f.path);
  }
  return { created, kept };
}
