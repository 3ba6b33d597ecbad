import { defineTaskSuite } from '../suites/tasks.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineTaskSuite(postgresFixture);
