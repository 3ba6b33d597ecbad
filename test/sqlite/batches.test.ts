import { defineBatchSuite } from '../suites/batches.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineBatchSuite(sqliteFixture);
