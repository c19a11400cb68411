import { openStore } from '../../src/store/index.js';
import { createTestDatabase } from '../helpers/pg.js';
import { leaseConformance } from './lease-suite.js';

leaseConformance('PostgreSQL', async () => {
  const db = await createTestDatabase('lease');
  const store = await openStore({ databaseUrl: db.url });
  return {
    store,
    cleanup: async () => {
      await store.close();
      await db.drop();
    },
  };
});
