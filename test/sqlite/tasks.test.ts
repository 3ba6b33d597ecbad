import { defineTaskSuite } from '../suites/tasks.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineTaskSuite(sqliteFixture);
