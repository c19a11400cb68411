/** Version 2 of `roll` (the new deploy): a step added. */
import { z } from 'zod';
import { defineWorkflow } from '../../src/definitions/index.js';
import { rollStep } from './_tools.js';

export const rollV2 = defineWorkflow({
  name: 'chaos_roll',
  version: 2,
  input: z.object({ n: z.number().int() }),
  steps: [
    { tool: rollStep('roll_prepare', 2) },
    { tool: rollStep('roll_check', 2), input: ({ results }) => results.roll_prepare },
    { tool: rollStep('roll_finish', 2), input: ({ results }) => results.roll_check },
  ],
});
