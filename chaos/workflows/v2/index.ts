/**
 * The new deploy: the common workflows, `chaos_roll` version 2, and version 1 kept loaded so
 * the runs that started on it finish on it after every old worker is gone.
 */
export { agent, approval, child, fanout, flaky, limited, map, parent, pipeline, signal, tenant } from '../_flows.js';
export { rollV1 } from '../_roll-v1.js';
export { rollV2 } from '../_roll-v2.js';
