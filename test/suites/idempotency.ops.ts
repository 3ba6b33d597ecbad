/** Contender operations for the idempotent-create suite (run in child processes by the race helper). */
import type { Store } from '../../src/index.js';
import { defineOperations } from '../support/operations.js';

/** Creates the task `args.id` (the same input in every contender); returns its id. */
export async function createSameTask(store: Store, args: { id: string; companyId: string }) {
  const task = await store.tasks.createTask({
    id: args.id,
    companyId: args.companyId,
    title: 'the same task',
    requiresFilesystem: false,
  });
  return { id: task.id };
}

/** Starts the run `args.id` on `args.targetKey` (the same input in every contender). */
export async function startSameRun(store: Store, args: { id: string; targetKey: string }) {
  const run = await store.runs.startCoordinatorRun({ id: args.id, targetKey: args.targetKey });
  return { id: run.id, status: run.status };
}

/** Creates the company `args.id`. */
export async function createSameCompany(store: Store, args: { id: string }) {
  return { id: (await store.org.createCompany({ id: args.id, name: 'Same' })).id };
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, { createSameTask, startSameRun, createSameCompany });
