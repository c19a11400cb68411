import { defineConfig } from 'drizzle-kit';

// drizzle-kit generates the SQL migrations in drizzle/ from the schema; they are committed.
export default defineConfig({
  dialect: 'postgresql',
  schema: ['./src/store/schema.ts', './src/store/schedules.schema.ts', './src/store/waits.schema.ts'],
  out: './drizzle',
});
