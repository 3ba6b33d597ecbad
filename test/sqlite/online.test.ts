import { defineOnlineMigrationSuite } from '../suites/online.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineOnlineMigrationSuite(sqliteFixture);
