import { readFile } from 'node:fs/promises';
import { InvalidInputError } from '../../errors.js';

/** `--input`: inline JSON, or `@path` to a JSON file (`@-` reads stdin). Bad JSON is invalid_input (exit 2). */
export async function readRunInput(arg: string): Promise<unknown> {
  let text = arg;
  let source = '--input';
  if (arg.startsWith('@')) {
    const path = arg.slice(1);
    source = path === '-' ? 'stdin' : path;
    try {
      text = path === '-' ? await readStdin() : await readFile(path, 'utf8');
    } catch (err) {
      throw new InvalidInputError(`cannot read the input file ${path}: ${(err as Error).message}`, 'input', {
        reason: 'unreadable_input',
        file: path,
      });
    }
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw new InvalidInputError(`the input (${source}) is not JSON: ${(err as Error).message}`, 'input', { reason: 'invalid_json' });
  }
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/** A JSON option (`--data`, `--input`): inline JSON or `@path` (`@-` stdin); bad JSON is invalid_input at `path` (exit 2). */
export async function readJsonArg(arg: string, flag: string, path: string): Promise<unknown> {
  try {
    return await readRunInput(arg);
  } catch (err) {
    if (err instanceof InvalidInputError) {
      throw new InvalidInputError(err.message.replace(/--input/g, flag).replace(/ \(at input\)$/, ''), path, {
        reason: err.details.reason,
      });
    }
    throw err;
  }
}
