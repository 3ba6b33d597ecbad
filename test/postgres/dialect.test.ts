import { defineDialectSuite } from '../suites/dialect.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineDialectSuite(postgresFixture);
