/** Version 1 of `roll` (the old deploy): two steps. */
import { z } from 'zod';
import { defineWorkflow } from '../../src/definitions/index.js';
import { rollStep } from './_tools.js';

export const rollV1 = defineWorkflow({
  name: 'chaos_roll',
  version: 1,
  input: z.object({ n: z.number().int() }),
  steps: [{ tool: rollStep('roll_prepare', 1) }, { tool: rollStep('roll_finish', 1), input: ({ results }) => results.roll_prepare }],
});
