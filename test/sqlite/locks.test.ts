import { defineLockSuite } from '../suites/locks.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineLockSuite(sqliteFixture);
