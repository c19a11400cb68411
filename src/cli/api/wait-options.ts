import { InvalidInputError } from '../../errors.js';

/** `--stage <id>`: a stage id (digits), checked before anything is asked. */
export function stageIdOption(value: string | undefined): { stageId?: string } {
  if (value === undefined) return {};
  if (!/^\d{1,19}$/.test(value.trim())) throw new InvalidInputError('--stage must be a stage id (digits)', 'stage');
  return { stageId: value.trim() };
}
