import { defineRunSuite } from '../suites/runs.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineRunSuite(sqliteFixture);
