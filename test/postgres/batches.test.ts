import { defineBatchSuite } from '../suites/batches.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineBatchSuite(postgresFixture);
