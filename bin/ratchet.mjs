#!/usr/bin/env node
// The `ratchet` command: TypeScript sources run through tsx's loader (Node 20, no build step).
import { register } from 'tsx/esm/api';

register();
await import('../src/cli/main.ts');
