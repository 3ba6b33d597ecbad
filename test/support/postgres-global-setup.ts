import type { TestProject } from 'vitest/node';
import { choosePostgres } from './postgres-source.js';

declare module 'vitest' {
  export interface ProvidedContext {
    pgAdminUrl: string;
    pgLabel: string;
  }
}

/** Starts (or finds) PostgreSQL once for the postgres project and prints which one. */
export default async function setup(project: TestProject) {
  const source = await choosePostgres();
  console.log(`[taskfence tests] PostgreSQL: ${source.label}`);
  project.provide('pgAdminUrl', source.adminUrl);
  project.provide('pgLabel', source.label);
  return async () => {
    await source.stop();
  };
}
