import { defineMigrationSuite } from '../suites/migrations.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineMigrationSuite(postgresFixture);
