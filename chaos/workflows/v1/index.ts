/** The old deploy: the common workflows and `chaos_roll` version 1. */
export { agent, approval, child, fanout, flaky, limited, map, parent, pipeline, signal, tenant } from '../_flows.js';
export { rollV1 } from '../_roll-v1.js';
