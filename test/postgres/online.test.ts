import {
  defineLockQueueSuite,
  defineOnlineMigrationSuite,
  defineCompatibilityWindowSuite,
} from '../suites/online.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineOnlineMigrationSuite(postgresFixture);
defineLockQueueSuite(postgresFixture);
defineCompatibilityWindowSuite(postgresFixture);
