/**
 * `taskfence/ui`: the live dashboard, a separate entry point so that `import 'taskfence'` never
 * loads it. No dependencies beyond Node's own http server; the page is plain HTML/JS/CSS.
 */
export { startDashboard, type Dashboard, type DashboardOptions } from './server.js';
export { runOperatorAction, OPERATOR_ACTIONS, type OperatorActionName, type ActionResult } from './actions.js';
export { readAuditTrail, type AuditEvent, type AuditTrailFilter } from '../inspect/audit.js';
export {
  explainTask,
  inspectStore,
  runTimeline,
  buildPathTree,
  DEFAULT_INSPECT_LIMIT,
  DEFAULT_STALE_AFTER_MS,
} from '../inspect/index.js';
export type * from '../inspect/types.js';
