import { defineMigrationSuite } from '../suites/migrations.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineMigrationSuite(sqliteFixture);
