import { defineOnlineMigrationSuite, defineCompatibilityWindowSuite } from '../suites/online.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineOnlineMigrationSuite(sqliteFixture);
defineCompatibilityWindowSuite(sqliteFixture);
