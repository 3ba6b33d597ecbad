import { defineDialectSuite } from '../suites/dialect.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineDialectSuite(sqliteFixture);
