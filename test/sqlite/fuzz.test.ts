import { defineFuzzSuite } from '../suites/fuzz.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineFuzzSuite(sqliteFixture);
