import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openStore } from '../../src/store/index.js';
import { claimConformance } from './claim-suite.js';

claimConformance('PGlite', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'ratchet-claim-'));
  const store = await openStore({ dataDir: dir });
  return {
    store,
    cleanup: async () => {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
});
