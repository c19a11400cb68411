import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { InvalidDefinitionError } from '../../src/errors.js';
import { defineTool, toolJsonSchema } from '../../src/definitions/index.js';
import { makeClass } from './fixtures.js';

const input = z.object({
  url: z.string().describe('The document URL'),
  pages: z.number().int().min(1).optional(),
  format: z.enum(['text', 'markdown']).default('text'),
  tags: z.array(z.string()),
});

const tool = defineTool({
  name: 'fetch_doc',
  description: 'Fetches a document',
  class: makeClass(),
  input,
  output: z.object({ text: z.string() }),
  run: async () => ({ text: '' }),
});

describe('toolJsonSchema', () => {
  const schema = toolJsonSchema(tool) as {
    type: string;
    required: string[];
    properties: Record<string, Record<string, unknown>>;
    $schema?: string;
  };

  it('is the JSON Schema of the input, without $schema', () => {
    expect(schema.type).toBe('object');
    expect(schema.$schema).toBeUndefined();
    expect(Object.keys(schema.properties).sort()).toEqual(['format', 'pages', 'tags', 'url']);
  });

  it('marks what zod requires as required (input side: defaulted and optional fields are not)', () => {
    expect([...schema.required].sort()).toEqual(['tags', 'url']);
  });

  it('carries the types, enums, bounds and descriptions', () => {
    expect(schema.properties.url).toEqual({ type: 'string', description: 'The document URL' });
    expect(schema.properties.pages).toMatchObject({ type: 'integer', minimum: 1 });
    expect(schema.properties.format).toMatchObject({ type: 'string', enum: ['text', 'markdown'], default: 'text' });
    expect(schema.properties.tags).toEqual({ type: 'array', items: { type: 'string' } });
  });

  it('agrees with zod on sample values', () => {
    const ok = { url: 'https://x', tags: [] };
    expect(input.safeParse(ok).success).toBe(true);
    for (const field of schema.required) {
      const { [field]: _dropped, ...missing } = ok as Record<string, unknown>;
      expect(input.safeParse(missing).success).toBe(false);
    }
  });

  it('refuses an input JSON Schema cannot express, naming the tool', () => {
    const dated = defineTool({
      name: 'dated',
      description: 'd',
      class: makeClass(),
      input: z.object({ at: z.date() }),
      output: z.object({}),
      run: async () => ({}),
    });
    expect(() => toolJsonSchema(dated)).toThrow(InvalidDefinitionError);
    expect(() => toolJsonSchema(dated)).toThrow(/tool "dated"/);
  });
});
