import { createInProcessTransport } from '../../src/transport/in-process.js';
import { transportConformance } from './conformance.js';

transportConformance('in-process', async () => createInProcessTransport());
