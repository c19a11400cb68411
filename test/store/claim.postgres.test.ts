import { openStore } from '../../src/store/index.js';
import { createTestDatabase } from '../helpers/pg.js';
import { claimConformance } from './claim-suite.js';

claimConformance('PostgreSQL', async () => {
  const db = await createTestDatabase('claim');
  const store = await openStore({ databaseUrl: db.url });
  return {
    store,
    cleanup: async () => {
      await store.close();
      await db.drop();
    },
  };
});
